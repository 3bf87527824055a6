"""Shared-prefix attention as a varlen kernel, registered through transformers' attention interface.

The packed layout (see shared_prefix.py) puts one or more groups in a row:
[prompt_1 | c_11 .. c_1G | prompt_2 | c_21 .. | ...]. Its attention is a set of independent
"sequences": each prompt attends causally to itself, and completion i attends to
[its prompt's keys, its own keys] causally, aligned bottom-right (query t of C_i sees keys
0 .. P + t). That is exactly `flash_attn_varlen_func(seqlen_q=C_i, seqlen_k=P+C_i, causal=True)`,
so on GPU the layout runs on flash-attention itself; nothing is (P+GC)^2.

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


def base_kernel() -> str:
    """What every non-layout call runs on: flash_attention_2 where it can, else sdpa."""
    return "flash_attention_2" if flash_available() else "sdpa"


@dataclass
class VarlenLayout:
    """Flattened (B*T) token indices of each varlen sequence's queries and keys."""

    q_index: torch.Tensor  # [total_q] positions into the flattened B*T tokens
    k_index: torch.Tensor  # [total_k]
    cu_q: torch.Tensor  # [S+1] int32 cumulative query lengths
    cu_k: torch.Tensor  # [S+1] int32
    max_q: int
    max_k: int


def layout_from_segments(seg: torch.Tensor) -> VarlenLayout:
    """Varlen sequences of a [B, T] segment-id tensor (-1 = pad, never a query nor a key)."""
    seg_cpu = seg.detach().to("cpu", torch.long)
    t = seg_cpu.shape[1]
    q_parts, k_parts, lq, lk = [], [], [], []
    for b, row in enumerate(seg_cpu.tolist()):
        prompts: dict[int, torch.Tensor] = {}
        start = 0
        while start < t:  # runs of equal segment id
            value, end = row[start], start + 1
            while end < t and row[end] == value:
                end += 1
            idx = torch.arange(b * t + start, b * t + end)
            if value >= 0:
                group, j = divmod(value, SEGMENT_BASE)
                keys = idx if j == 0 else torch.cat([prompts[group], idx])
                if j == 0:
                    prompts[group] = idx
                q_parts.append(idx)
                k_parts.append(keys)
                lq.append(len(idx))
                lk.append(len(keys))
            start = end
    device = seg.device

    def cu(lengths):
        return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)

    return VarlenLayout(torch.cat(q_parts).to(device), torch.cat(k_parts).to(device), cu(lq), cu(lk),
                        max(lq), max(lk))


def _emulated_varlen(q, k, v, cu_q, cu_k, scale):
    """flash_attn_varlen_func(causal=True) in plain torch: q [Nq, H, D], k/v [Nk, Hkv, D].
    Causal is bottom-right aligned (query t of a length-Lq sequence sees keys 0 .. Lk-Lq+t), as
    flash-attn >= 2.1 defines it. Memory: one Lq x Lk score matrix per sequence."""
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


def prefix_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                            scale: float | None = None) -> torch.Tensor:
    """THE kernel call. q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, T, H, D] (pad tokens: 0).
    flash_attn_varlen_func on GPU when flash-attn imports; its torch emulation otherwise."""
    b, h, t, d = q.shape
    qf = q.transpose(1, 2).reshape(b * t, h, d)[layout.q_index]
    kf = k.transpose(1, 2).reshape(b * t, k.shape[1], d)[layout.k_index]
    vf = v.transpose(1, 2).reshape(b * t, v.shape[1], v.shape[-1])[layout.k_index]
    if q.is_cuda and flash_available():
        from flash_attn import flash_attn_varlen_func

        o = flash_attn_varlen_func(qf, kf, vf, layout.cu_q, layout.cu_k, layout.max_q, layout.max_k,
                                   causal=True, softmax_scale=scale)
    else:
        o = _emulated_varlen(qf, kf, vf, layout.cu_q, layout.cu_k, scale)
    out = o.new_zeros(b * t, h, o.shape[-1]).index_copy(0, layout.q_index, o)
    return out.view(b, t, h, -1)


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
