"""Shared-prefix attention as a varlen kernel, registered through transformers' attention interface.

The packed layout (see shared_prefix.py) puts one or more groups in a row:
[prompt_1 | c_11 .. c_1G | prompt_2 | c_21 .. | ...]. Its attention is a set of independent
"sequences": each prompt attends causally to itself, and completion i attends to
[its prompt's keys, its own keys] causally, aligned bottom-right (query t of C_i sees keys
0 .. P + t). That is exactly `flash_attn_varlen_func(seqlen_q=C_i, seqlen_k=P+C_i, causal=True)`,
so on GPU the layout runs on flash-attention itself; nothing is (P+GC)^2. On CPU the same
attention runs as two fused calls per group merged by log-sum-exp (split_attention.py): the
completions share the one prompt K/V instead of each gathering a copy of it.

Why varlen rather than flex attention with a block mask: flex needs `torch.compile` to be fast
(eager flex materialises the full score matrix), its block masks are rebuilt for every new
layout (every step has new lengths), and on GPU users already pick flash-attention 2 for the
rest of the model. Varlen runs the same flash kernel with no compile, and several groups pack
into ONE row with no padding at all (padding-free micro-batches).

The layout travels as the model's 4-D `attention_mask`: an integer tensor [B, 1, 1, T] of
segment ids (transformers passes a 4-D mask through untouched, and through gradient
checkpointing's recompute). Calls without it (vision encoders, generation, the naive layout)
go to the base kernel: flash_attention_2 where flash-attn imports and CUDA is present, else sdpa.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "mmrl_prefix_varlen"
SEGMENT_BASE = 1 << 20  # segment id = group * SEGMENT_BASE + j (j = 0 prompt, j >= 1 completion j)


def flash_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def kernel_description() -> str:
    """What the layout's attention runs on here, for the one start-of-run line."""
    if flash_available():
        return "flash_attn_varlen_func"
    if torch.cuda.is_available():
        return "a per-sequence torch emulation: install flash-attn for the fused kernel"
    return "CPU: fused prompt and completion calls merged by log-sum-exp"


def base_kernel() -> str:
    """What every non-layout call runs on: flash_attention_2 where it can, else sdpa."""
    return "flash_attention_2" if flash_available() else "sdpa"


@dataclass
class GroupSpan:
    """One group in the flattened (B*T) tokens: its prompt [start, start + prompt), then its
    completions back to back (`lengths`, in order)."""

    start: int
    prompt: int
    lengths: list[int]
    batched: object = None  # split_attention's padding index for the completions, built on first use


@dataclass
class VarlenLayout:
    """The varlen sequences of a segment-id row: per group its prompt and completion spans, and
    (built on first use, for flash-attn) the flattened token indices of each sequence."""

    groups: list[GroupSpan]
    tokens: int  # B*T
    device: torch.device
    _flash: tuple | None = None

    def flash_args(self):
        """(q_index, k_index, cu_q, cu_k, max_q, max_k): sequence s's queries are tokens
        q_index[cu_q[s]:cu_q[s+1]], its keys k_index[cu_k[s]:cu_k[s+1]] (prompt keys repeated)."""
        if self._flash is None:
            q_parts, k_parts, lq, lk = [], [], [], []
            for g in self.groups:
                prompt = torch.arange(g.start, g.start + g.prompt)
                q_parts.append(prompt), k_parts.append(prompt), lq.append(g.prompt), lk.append(g.prompt)
                offset = g.start + g.prompt
                for n in g.lengths:
                    own = torch.arange(offset, offset + n)
                    q_parts.append(own), k_parts.append(torch.cat([prompt, own]))
                    lq.append(n), lk.append(g.prompt + n)
                    offset += n

            def cu(lengths):
                return torch.tensor([0] + lengths).cumsum(0).to(self.device, torch.int32)

            self._flash = (torch.cat(q_parts).to(self.device), torch.cat(k_parts).to(self.device),
                           cu(lq), cu(lk), max(lq), max(lk))
        return self._flash


def layout_from_segments(seg: torch.Tensor) -> VarlenLayout:
    """Varlen layout of a [B, T] segment-id tensor (-1 = pad, never a query nor a key). Each
    group's completions must follow its prompt back to back (what pack_groups writes)."""
    seg_cpu = seg.detach().to("cpu", torch.long)
    t = seg_cpu.shape[1]
    groups: list[GroupSpan] = []
    for b, row in enumerate(seg_cpu):
        values, counts = torch.unique_consecutive(row, return_counts=True)
        start, current = b * t, {}
        for value, n in zip(values.tolist(), counts.tolist()):
            if value >= 0:
                group, j = divmod(value, SEGMENT_BASE)
                if j == 0:
                    current[group] = GroupSpan(start, n, [])
                    groups.append(current[group])
                else:
                    g = current.get(group)
                    if g is None or g.start + g.prompt + sum(g.lengths) != start:
                        raise ValueError(f"segment ids: completion {j} of group {group} does not "
                                         f"follow its prompt and earlier completions back to back")
                    g.lengths.append(n)
            start += n
    return VarlenLayout(groups, seg.shape[0] * t, seg.device)


def _emulated_varlen(q, k, v, cu_q, cu_k, scale):
    """flash_attn_varlen_func(causal=True) in plain torch: q [Nq, H, D], k/v [Nk, Hkv, D].
    Causal is bottom-right aligned (query t of a length-Lq sequence sees keys 0 .. Lk-Lq+t), as
    flash-attn >= 2.1 defines it. The semantic reference (and the path for CUDA without
    flash-attn): one Lq x Lk score matrix per sequence, the prompt's keys copied per completion."""
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    gqa = q.shape[1] != k.shape[1]
    for s in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[s], bounds_q[s + 1], bounds_k[s], bounds_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        allowed = (torch.arange(lk, device=q.device)[None]
                   <= torch.arange(lq, device=q.device)[:, None] + (lk - lq))
        o = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1),
            attn_mask=allowed, scale=scale, enable_gqa=gqa)
        out[q0:q1] = o.transpose(0, 1)
    return out


def _varlen_call(q, k, v, layout: VarlenLayout, scale, flash: bool):
    """flash_attn_varlen_func (or its emulation) over the layout's sequences; [B, T, H, D]."""
    b, h, t, d = q.shape
    q_index, k_index, cu_q, cu_k, max_q, max_k = layout.flash_args()
    qf = q.transpose(1, 2).reshape(b * t, h, d)[q_index]
    kf = k.transpose(1, 2).reshape(b * t, k.shape[1], d)[k_index]
    vf = v.transpose(1, 2).reshape(b * t, v.shape[1], v.shape[-1])[k_index]
    if flash:
        from flash_attn import flash_attn_varlen_func

        o = flash_attn_varlen_func(qf, kf, vf, cu_q, cu_k, max_q, max_k, causal=True, softmax_scale=scale)
    else:
        o = _emulated_varlen(qf, kf, vf, cu_q, cu_k, scale)
    out = o.new_zeros(b * t, h, o.shape[-1]).index_copy(0, q_index, o)
    return out.view(b, t, h, -1)


def prefix_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                            scale: float | None = None) -> torch.Tensor:
    """THE kernel call. q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, T, H, D] (pad tokens: 0).
    GPU: flash_attn_varlen_func (seqlen_k = P + C_i, bottom-right causal). CPU: the same
    attention split in two fused calls merged by log-sum-exp (split_attention.py), which never
    copies the prompt's keys. CUDA without flash-attn: the per-sequence emulation."""
    if q.is_cuda and flash_available():
        return _varlen_call(q, k, v, layout, scale, flash=True)
    if q.device.type == "cpu":
        from mmrl.models.split_attention import split_prefix_attention

        return split_prefix_attention(q, k, v, layout.groups, scale)
    return _varlen_call(q, k, v, layout, scale, flash=False)


_cache: list = [None, None]  # (segment tensor, its layout): every layer of a forward shares one


def _layout_of(mask: torch.Tensor) -> VarlenLayout:
    if _cache[0] is not mask:
        _cache[0], _cache[1] = mask, layout_from_segments(mask[:, 0, 0])
    return _cache[1]


def is_segment_mask(mask) -> bool:
    return torch.is_tensor(mask) and mask.ndim == 4 and mask.shape[2] == 1 and not mask.is_floating_point() \
        and mask.dtype != torch.bool


def prefix_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             **kwargs):
    """transformers attention-interface signature; q/k/v are [B, H, T, D]."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not is_segment_mask(attention_mask):
        return ALL_ATTENTION_FUNCTIONS[base_kernel()](module, query, key, value, attention_mask,
                                                      scaling=scaling, dropout=dropout, **kwargs)
    if dropout and module.training:
        raise ValueError("shared-prefix attention does not implement attention dropout")
    return prefix_varlen_attention(query, key, value, _layout_of(attention_mask), scaling), None


def register() -> str:
    """Register NAME (attention + its mask builder: the base kernel's) once; returns NAME."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, prefix_attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS[base_kernel()])
    return NAME


register()  # importing this module makes NAME loadable: from_pretrained(attn_implementation=NAME)
