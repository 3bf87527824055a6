"""The shared-prefix varlen kernel (mmrl.models.prefix_attention) equals the naive layout.

Every family, through transformers' attention interface with no per-model code: float32
logprobs to 1e-5 and gradients to 1e-5 relative, ragged completions, a group split across
micro-batches, gradient checkpointing on. Plus the kernel itself against a dense masked
reference, the real flash-attn kernel where it can run, and bf16 within a stated tolerance."""
from __future__ import annotations

import contextlib

import pytest
import torch

from mmrl.models import get_adapter
from mmrl.models import prefix_attention as pa
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import pack_groups, shared_prefix_logprobs, uses_varlen
from mmrl.types import Sample
from tests.models.test_adapters_av import media, messages
from tests.models.test_shared_prefix import completions, logprobs_and_grads

G = 4
FAMILIES = [("qwen2_vl", "image"), ("qwen2_5_vl", "video"), ("qwen3_vl", "image"),
            ("qwen2_audio", "audio"), ("qwen2_5_omni", "audio")]
ENCODER = {"audio": "audio_tower.", "image": "visual.", "video": "visual."}


@contextlib.contextmanager
def attention(model, name):
    saved = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(saved)


def family_case(family, modality, dtype=torch.float32):
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    model = model.to(dtype)
    prompts = [adapter.prompt_features(processor, Sample(id=f"s{i}", messages=messages(kinds, text)), **kw)
               for i, (kinds, text, kw) in enumerate(media(modality))]
    pad = processor.tokenizer.pad_token_id
    rows = [prompts[0]] * G + [prompts[1]] * G
    ids, mask = completions(2 * G, pad, seed=7)  # ragged: lengths 10, 3, 7, 1, 5, 10, 2, 8
    return model, rows, ids, mask, pad


@pytest.mark.parametrize("family,modality", FAMILIES)
def test_varlen_equals_naive_split_groups_checkpointing(family, modality):
    model, rows, ids, mask, pad = family_case(family, modality)
    pa.register()

    def naive():
        return (*completion_logprobs(model, collate(rows, ids, mask, pad), ids, mask,
                                     return_entropy=True), mask)

    def varlen():
        assert uses_varlen(model)
        parts = [list(range(0, 6)), list(range(6, 8))]  # the second group is cut in two
        lp, ent = torch.zeros(ids.shape), torch.zeros(ids.shape)
        for part in parts:
            p_lp, p_ent = shared_prefix_logprobs(model, [rows[i] for i in part], ids[part], mask[part],
                                                 return_entropy=True, pad_id=pad)
            lp, ent = lp.index_put((torch.tensor(part),), p_lp), ent.index_put((torch.tensor(part),), p_ent)
        return lp, ent, mask

    lp_n, ent_n, g_n = logprobs_and_grads(model, naive)
    with attention(model, pa.NAME):
        lp_v, ent_v, g_v = logprobs_and_grads(model, varlen, checkpointing=True)
    m = mask.bool()
    assert ((lp_n - lp_v).abs() * m).max() <= 1e-5
    assert ((ent_n - ent_v).abs() * m).max() <= 1e-5
    assert g_n.keys() == g_v.keys() and len(g_n) >= 10
    worst = max(((g_n[k] - g_v[k]).norm() / g_n[k].norm().clamp(min=1e-20)).item() for k in g_n)
    assert worst <= 1e-5, worst
    encoder = [k for k in g_v if ENCODER[modality] in k and g_v[k].abs().sum() > 0]
    assert len(encoder) >= 4, "the media encoder must receive gradient through the varlen path"


def test_bf16_within_tolerance():
    """bf16 has an 8-bit mantissa: per-token logprobs of the two layouts differ by summation
    order only. Stated tolerance: |diff| <= 0.05 nats per token (measured ~1e-2)."""
    model, rows, ids, mask, pad = family_case("qwen2_5_vl", "image", torch.bfloat16)
    pa.register()
    with torch.no_grad():
        naive = completion_logprobs(model, collate(rows, ids, mask, pad), ids, mask)
        with attention(model, pa.NAME):
            varlen = shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad)
    assert ((naive - varlen).abs() * mask).max() <= 0.05


def dense_reference(q, k, v, seg):
    """The same attention as one dense [T, T] boolean mask (group_attention_mask semantics,
    extended to several groups in a row): what the sdpa path computes."""
    group = torch.div(seg, pa.SEGMENT_BASE, rounding_mode="floor")
    t = seg.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    same_group = group[:, :, None] == group[:, None, :]
    to_prompt = (seg % pa.SEGMENT_BASE == 0)[:, None, :]
    allowed = causal & same_group & (to_prompt | (seg[:, :, None] == seg[:, None, :]))
    allowed &= (seg >= 0)[:, None, :]
    allowed |= torch.eye(t, dtype=torch.bool)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None],
                                                           enable_gqa=True)
    return out.transpose(1, 2) * (seg >= 0)[:, :, None, None]


def segments():
    base = pa.SEGMENT_BASE
    # Group 0: prompt 5, completions 3, 1, 4; group 1: prompt 2, completions 2, 3.
    row = [0] * 5 + [1] * 3 + [2] + [3] * 4 + [base] * 2 + [base + 1] * 2 + [base + 2] * 3
    return torch.tensor([row])


def kernel_inputs(seg, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, seg.shape[1], 8, generator=gen, dtype=dtype)
    k, v = (torch.randn(1, 2, seg.shape[1], 8, generator=gen, dtype=dtype) for _ in range(2))  # GQA 4:2
    return [x.requires_grad_() for x in (q, k, v)]


# Two groups with ragged completions; one group with equal completions and a padded tail.
SEGMENT_CASES = [segments, lambda: torch.tensor([[0] * 6 + [1] * 4 + [2] * 4 + [3] * 4 + [-1] * 3])]


@pytest.mark.parametrize("case", SEGMENT_CASES)
@pytest.mark.parametrize("path", ["split", "emulated"])
def test_kernel_equals_dense_mask_values_and_gradients(case, path):
    """The CPU path (prompt causal + completions on the prompt K/V and on their own K/V, merged
    by LSE, hand-written backward) and the per-sequence flash_attn_varlen_func emulation both
    equal one dense masked sdpa: outputs, and q/k/v gradients of every real token."""
    seg = case()
    q, k, v = kernel_inputs(seg)
    layout = pa.layout_from_segments(seg)
    if path == "split":
        got = pa.prefix_varlen_attention(q, k, v, layout)
    else:
        got = pa._varlen_call(q, k, v, layout, None, flash=False)
    want = dense_reference(q, k, v, seg)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad((got * weights).sum(), (q, k, v)),
                    torch.autograd.grad((want * weights).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_varlen_sequences_and_score_count():
    seg = segments()
    q_index, k_index, cu_q, cu_k, max_q, max_k = pa.layout_from_segments(seg).flash_args()
    # Sequences: prompt(5) then completions see 5 + C_i keys; the second group likewise.
    assert cu_q.tolist() == [0, 5, 8, 9, 13, 15, 17, 20]
    assert cu_k.tolist() == [0, 5, 13, 19, 28, 30, 34, 39]
    assert k_index[5:13].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and (max_q, max_k) == (5, 9)
    # Score entries: P^2 + sum C_i (P + C_i) per group, not (P + sum C_i)^2.
    scores = sum((b - a) * (d - c) for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(),
                                                         cu_k[:-1].tolist(), cu_k[1:].tolist()))
    assert scores == 5 * 5 + 3 * 8 + 1 * 6 + 4 * 9 + 2 * 2 + 2 * 4 + 3 * 5


def saved_numel(fn) -> int:
    """Elements autograd keeps for backward while `fn` runs."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x, lambda x: x):
        fn()
    return sum(saved)


@pytest.mark.parametrize("prompt,group", [(256, 8), (512, 8), (256, 16)])
def test_split_path_keeps_linear_memory_for_backward(prompt, group):
    """What the CPU path keeps for backward grows as P + sum C_i per group (fused kernels: no
    score matrix; the prompt K/V shared by every completion, never copied), where the dense row
    keeps a (P+GC)^2 mask and the per-sequence emulation copies the prompt's keys G times."""
    c, heads, dim = 4, 4, 8
    seg = torch.tensor([[0] * prompt + [j for j in range(1, group + 1) for _ in range(c)]])
    q, k, v = kernel_inputs(seg)
    layout = pa.layout_from_segments(seg)
    split = saved_numel(lambda: pa.prefix_varlen_attention(q, k, v, layout))
    emulated = saved_numel(lambda: pa._varlen_call(q, k, v, layout, None, flash=False))
    dense = saved_numel(lambda: dense_reference(q, k, v, seg))
    tokens = prompt + group * c
    # q, k, v (2 of 4 heads), out, lse of both parts, the prompt K/V once more for the completions
    assert split <= 5 * tokens * heads * dim
    assert split < dense and split * 5 < emulated, (split, dense, emulated)


def test_pack_varlen_is_one_padfree_row_with_the_sdpa_rows_positions():
    model, rows, ids, mask, pad = family_case("qwen2_vl", "image")
    dense = pack_groups(model, rows, ids, mask, pad)
    varlen = pack_groups(model, rows, ids, mask, pad, varlen=True)
    assert dense.inputs["input_ids"].shape[0] == 2 and dense.pad_fraction > 0
    assert varlen.inputs["input_ids"].shape[0] == 1 and varlen.pad_fraction == 0.0
    # Every real token once (each prompt once, completion tokens but their last), no pad.
    real = rows[0].input_ids.shape[0] + rows[G].input_ids.shape[0] + int((mask.sum(1) - 1).clamp(min=0).sum())
    assert varlen.inputs["input_ids"].shape[1] == real < dense.inputs["input_ids"].numel()
    # Positions of every real token are the sdpa rows' positions, concatenated.
    seg = varlen.inputs["attention_mask"][0, 0, 0]
    first = int((seg < pa.SEGMENT_BASE).sum())
    torch.testing.assert_close(varlen.inputs["position_ids"][:, 0, :first],
                               dense.inputs["position_ids"][:, 0, :first])


@pytest.mark.skipif(not pa.flash_available(),
                    reason="needs CUDA and the flash-attn package (CUDA-only wheel); the emulation "
                           "above is tested against a dense mask instead")
def test_real_flash_kernel_equals_emulation():
    seg = segments().cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 4, seg.shape[1], 64, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, seg.shape[1], 64, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    flash = pa.prefix_varlen_attention(q, k, v, pa.layout_from_segments(seg))
    emulated = pa.prefix_varlen_attention(q.cpu().float(), k.cpu().float(), v.cpu().float(),
                                          pa.layout_from_segments(seg.cpu()))
    torch.testing.assert_close(flash.float().cpu(), emulated, atol=2e-2, rtol=2e-2)


def test_flash_attention_2_switches_to_the_varlen_path_and_others_say_why():
    """What the trainer decides at start: flash_attention_2 (every GPU recipe) keeps the layout
    by switching to the varlen kernel (here its CPU emulation); a kernel that cannot take it
    says so in one line with what to set."""
    from mmrl.models.shared_prefix import attn_implementation, enable_shared_prefix

    model, rows, ids, mask, pad = family_case("qwen2_vl", "image")
    with torch.no_grad():
        want = completion_logprobs(model, collate(rows, ids, mask, pad), ids, mask)
    with attention(model, "sdpa"):
        for config in (model.config, model.config.text_config):
            config._attn_implementation = "flash_attention_2"  # as loaded on a GPU
        on, why = enable_shared_prefix(model)
        assert on and attn_implementation(model) == pa.NAME and "varlen" in why
        with torch.no_grad():
            got = shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad)
        assert ((want - got).abs() * mask).max() <= 1e-5
        model.config.text_config._attn_implementation = "flex_attention"
        on, why = enable_shared_prefix(model)
        assert not on and "OFF" in why and "flash_attention_2" in why and "\n" not in why
        assert enable_shared_prefix(model, wanted=False)[0] is False
