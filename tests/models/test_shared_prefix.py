"""The shared-prefix training forward equals the naive G x [prompt, completion] layout: per-token
logprobs and entropies to 1e-5 and every parameter gradient to 1e-5 relative (float32), for
Qwen2-VL and Qwen2.5-VL (images, video) and Qwen2-Audio, on real tiny models."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import (group_attention_mask, group_rows, layer_flops, pack_size,
                                       pack_groups, prompt_and_completion_positions,
                                       shared_prefix_logprobs, split_groups,
                                       supports_shared_prefix)
from mmrl.types import Sample

G = 4
WIDTH = 10
# Uneven lengths per row, incl. a 1-token and a full-width completion in each group.
LENGTHS = [10, 3, 7, 1, 5, 10, 2, 8]


def message(text: str, kind: str = "image", n: int = 1) -> list[dict]:
    return [{"role": "user", "content": [{"type": kind}] * n + [{"type": "text", "text": text}]}]


def completions(n_rows: int, pad_id: int, seed: int = 0, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 700, (n_rows, WIDTH), generator=gen)  # BPE ids: no placeholders
    lens = torch.tensor(lengths[:n_rows])
    mask = (torch.arange(WIDTH)[None] < lens[:, None]).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask


def logprobs_and_grads(model, fn, *, checkpointing: bool = False):
    """(logp, entropy, {param: grad}) of a loss touching both outputs."""
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.train()
    try:
        logp, ent, mask = fn()
        m = mask.float()
        # Weighted per row so that rows' gradients are not merely summed symmetrically.
        w = torch.linspace(0.5, 1.5, m.shape[0])[:, None]
        ((logp * m * w).sum() + 0.1 * (ent * m).sum()).backward()
    finally:
        if checkpointing:
            model.gradient_checkpointing_disable()
            model.eval()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logp.detach(), ent.detach(), grads


def assert_same(model, prompts, ids, mask, pad_id, *, checkpointing=False, visual_prefix=None,
                min_grads=10):
    def naive():
        inputs = collate(prompts, ids, mask, pad_id)
        return (*completion_logprobs(model, inputs, ids, mask, return_entropy=True), mask)

    def shared():
        return (*shared_prefix_logprobs(model, prompts, ids, mask, return_entropy=True,
                                        pad_id=pad_id), mask)

    lp_n, ent_n, g_n = logprobs_and_grads(model, naive)
    lp_s, ent_s, g_s = logprobs_and_grads(model, shared, checkpointing=checkpointing)
    m = mask.bool()
    assert ((lp_n - lp_s).abs() * m).max() <= 1e-5
    assert ((ent_n - ent_s).abs() * m).max() <= 1e-5
    assert (lp_s[~m] == 0).all()
    assert g_n.keys() == g_s.keys() and len(g_n) >= min_grads
    worst = max(((g_n[k] - g_s[k]).norm() / g_n[k].norm().clamp(min=1e-20)).item() for k in g_n)
    assert worst <= 1e-5, worst
    if visual_prefix:
        encoder = [k for k in g_s if k.startswith(visual_prefix) and g_s[k].abs().sum() > 0]
        assert len(encoder) >= 4, encoder


# ----------------------------------------------------------------------------- vision ---------

@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vl(request):
    adapter = get_adapter(request.param)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    return adapter, model, processor


@pytest.fixture(scope="module")
def image_prompts(vl):
    adapter, _, processor = vl
    one = adapter.prompt_features(processor, Sample(id="one", messages=message("How many?")),
                                  [Image.new("RGB", (56, 84), "white")])
    two = adapter.prompt_features(
        processor, Sample(id="two", messages=message("Which has more red circles?", n=2)),
        [Image.new("RGB", (84, 112), "red"), Image.new("RGB", (140, 56), "blue")])
    return one, two


@pytest.fixture(scope="module")
def video_prompt(vl):
    adapter, _, processor = vl
    frames = np.random.RandomState(0).randint(0, 255, (8, 56, 56, 3)).astype(np.uint8)
    # fps 0.5: 4 s per temporal patch, so Qwen2.5-VL's time positions run far past the text
    # that follows the video (5.19 continues text at start + max(h, w), not at max + 1).
    return adapter.prompt_features(processor, Sample(id="vid", messages=message("What moves?", "video")),
                                   videos=[frames], video_fps=0.5)


def test_images_two_groups_equal_naive(vl, image_prompts):
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    prompts = [image_prompts[0]] * G + [image_prompts[1]] * G
    ids, mask = completions(2 * G, pad)
    assert_same(model, prompts, ids, mask, pad, visual_prefix="model.visual.")


def test_video_equals_naive(vl, video_prompt):
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    ids, mask = completions(G, pad, seed=1)
    assert_same(model, [video_prompt] * G, ids, mask, pad, visual_prefix="model.visual.")


def test_completion_positions_are_the_naive_layouts(vl, video_prompt, image_prompts):
    """Packed positions of every completion token equal get_rope_index on the naive rows."""
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    for prompt in (video_prompt, image_prompts[1]):
        ids, mask = completions(G, pad, seed=2)
        naive = collate([prompt] * G, ids, mask, pad)
        want, _ = model.model.get_rope_index(
            naive["input_ids"], mm_token_type_ids=naive["mm_token_type_ids"],
            attention_mask=naive["attention_mask"],
            **{k: naive[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in naive})
        packed = pack_groups(model, [prompt] * G, ids, mask, pad)
        plen = prompt.input_ids.shape[0]
        got = packed.inputs["position_ids"][:, 0]  # [3, T] of the one packed row
        offset = plen
        for i, length in enumerate(LENGTHS[:G]):
            k = max(length - 1, 0)
            assert torch.equal(got[:, offset:offset + k], want[:, i, plen:plen + k])
            offset += k
        assert torch.equal(got[:, :plen], want[:, 0, :plen])
    positions = prompt_and_completion_positions(model, video_prompt, WIDTH)
    plen = video_prompt.input_ids.shape[0]
    if "second_per_grid_ts" in video_prompt.tensors:  # the trap a "max + 1" rule falls into
        assert positions[:, plen].max() < positions[:, :plen].max() + 1


def test_partial_and_interleaved_groups(vl, image_prompts):
    """A micro-batch may cut groups and hold rows in any order: rows are grouped by identity."""
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    a, b = image_prompts
    rows = [a, b, b, a, b]
    ids, mask = completions(len(rows), pad, seed=3)
    assert group_rows(rows) == [[0, 3], [1, 2, 4]]
    assert_same(model, rows, ids, mask, pad)


def test_gradient_checkpointing(vl, image_prompts):
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    prompts = [image_prompts[1]] * G
    ids, mask = completions(G, pad, seed=4)
    assert_same(model, prompts, ids, mask, pad, checkpointing=True, visual_prefix="model.visual.")


def test_all_empty_and_non_prefix_masks(vl, image_prompts):
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    ids, mask = completions(2, pad, lengths=[0, 4])
    with torch.no_grad():
        logp = shared_prefix_logprobs(model, [image_prompts[0]] * 2, ids, mask, pad_id=pad)
    assert (logp[0] == 0).all() and (logp[1, :4] != 0).all()
    mask[1, 1] = 0
    with pytest.raises(ValueError, match="row 1 is not a prefix"):
        shared_prefix_logprobs(model, [image_prompts[0]] * 2, ids, mask, pad_id=pad)


def test_placeholders_rejected(vl, image_prompts):
    adapter, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    ids, mask = completions(2, pad)
    ids[1, 0] = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with pytest.raises(ValueError, match="row 1"):
        shared_prefix_logprobs(model, [image_prompts[0]] * 2, ids, mask, pad_id=pad,
                               placeholder_ids=adapter.placeholder_token_ids(processor))


def test_flash_attention_is_not_supported(vl):
    _, model, _ = vl
    assert supports_shared_prefix(model)
    saved = model.config._attn_implementation
    try:
        model.config.text_config._attn_implementation = "flash_attention_2"
        assert not supports_shared_prefix(model)
    finally:
        model.config.text_config._attn_implementation = saved


# ----------------------------------------------------------------------------- audio ----------

def test_audio_equals_naive():
    qwen2_audio = pytest.importorskip("mmrl.models.qwen2_audio")
    adapter = qwen2_audio.Qwen2AudioAdapter()
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    pad = processor.tokenizer.pad_token_id
    rng = np.random.RandomState(0)

    def features(i: int, seconds: float):
        sample = Sample(id=f"a{i}", messages=message("What is said?" * (i + 1), "audio"))
        return adapter.prompt_features(processor, sample,
                                       audios=[rng.randn(int(16000 * seconds)).astype(np.float32) * 0.1])

    one, two = features(0, 1.0), features(1, 2.5)
    ids, mask = completions(2 * G, pad, seed=5)
    assert_same(model, [one] * G + [two] * G, ids, mask, pad, visual_prefix="model.audio_tower.")


# ----------------------------------------------------------------------------- pure pieces ----

def test_group_attention_mask():
    # prompt of 2, completion 1 of 2 tokens, completion 2 of 1 token, 1 pad
    seg = torch.tensor([[0, 0, 1, 1, 2, -1]])
    valid = torch.tensor([[True] * 5 + [False]])
    m = group_attention_mask(seg, valid)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [1, 1, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0],
                 [1, 1, 0, 0, 0, 1]]  # a pad query: harmless, never fully masked (NaN)


def test_lora_wrapped_model_uses_mrope_positions():
    """peft wraps the model: positions must still come from get_rope_index (not 1-D)."""
    peft = pytest.importorskip("peft")
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=1, num_hidden_layers=1)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    prompt = adapter.prompt_features(processor, Sample(id="l", messages=message("Count.")),
                                     [Image.new("RGB", (84, 56), "red")])
    pad = processor.tokenizer.pad_token_id
    ids, mask = completions(3, pad, seed=6)
    assert_same(wrapped, [prompt] * 3, ids, mask, pad, min_grads=4)  # lora A, B of q and v


def test_pack_size_is_the_run_with_the_fewest_flops(vl):
    """Hand-computed on the tiny text config (hidden 128, 4 heads of 32, 2 KV heads, ffn 256):
    a token costs 2 (2*128*128 + 2*128*64 + 3*128*256) = 294,912 FLOPs in a layer's linear maps,
    a score 4 * 4 * 32 = 512. A 32-token prompt and 8 completions of 84 tokens (a tool-use
    trajectory): runs of 1 / 2 / 4 / 8 cost 328.8M / 317.8M / 355.7M / 461.4M, so 2. A
    1024-token prompt with 64-token answers packs the whole group; so does a 7B-wide model
    (hidden 3584, 28 heads of 128, 4 KV heads, ffn 18944) at the tool-use lengths."""
    _, model, _ = vl
    tiny = layer_flops(model)
    assert tiny == (294_912, 512)
    assert pack_size(32, [84] * 8, tiny) == 2
    assert pack_size(1024, [64] * 8, tiny) == 8
    assert pack_size(32, [84], tiny) == 1
    wide = (2 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944), 4 * 28 * 128)
    assert pack_size(32, [84] * 8, wide) == 8


def test_split_groups_pack_in_runs_and_equal_naive(vl, image_prompts):
    """Long completions beside a short prompt: each group packs in runs (a shallow copy of its
    PromptFeatures a run, the same tensors), and the logprobs and gradients still equal naive."""
    _, model, processor = vl
    pad = processor.tokenizer.pad_token_id
    a, b = image_prompts
    rows = [a] * G + [b] * G
    width = 60
    ids = torch.randint(0, 700, (2 * G, width), generator=torch.Generator().manual_seed(5))
    mask = (torch.arange(width)[None] < torch.tensor([60, 55, 60, 58, 10, 3, 7, 5])[:, None]).long()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad))
    split = split_groups(model, rows, mask)
    assert group_rows(split)[:2] == [[0, 1], [2, 3]]  # long: runs of 2 (the short group whole)
    assert group_rows(split)[2:] == [[4, 5, 6, 7]]
    assert split[2] is not a and split[2].tensors is a.tensors and split[0] is a
    assert_same(model, split, ids, mask, pad, visual_prefix="model.visual.")
