"""Ulysses sequence parallelism for multimodal models: one forward's sequence split over N ranks.

As DeepSpeed-Ulysses does it: every rank of a sequence-parallel (SP) group holds the same
micro-batch and runs the decoder on its own contiguous 1/N of the sequence. Before attention,
one all-to-all turns [all heads, my tokens] into [my heads, all tokens] (q, k and v in one
exchange); attention runs on the whole sequence for H/N heads with the whole mask (any layout:
the causal naive rows, the shared-prefix 4-D group mask, the varlen segment ids); a second
all-to-all turns the output back. Registered through transformers' AttentionInterface
(`install`), so every family's decoder uses it; its mask builder is the inner kernel's, and a
call that is not sharded (generation, evaluation, the vision tower) goes straight to the inner
kernel.

What is sharded besides the decoder (`sequence_parallel_logprobs`):
- positions: computed once on the full sequence (M-RoPE: the model's own `get_rope_index`),
  then cut, so every rank's tokens carry the positions the unsplit forward gives them;
- media: each rank encodes its own share of the media units (a video's temporal patches, whole
  audios; media_embeds.py) and the embeddings are all-gathered into their placeholder positions;
  the gather's backward sums each rank's gradient, so every shard's encoder gets its gradient;
- logits: each rank computes its own tokens' logprobs; one all-reduce gives every rank the whole
  [N, L] (its backward passes the gradient through unchanged: the loss is the same on every rank).

Every rank then holds a disjoint part of its data-parallel rank's gradient, so gradients are
summed over ALL processes (SP x DP; what the DDP all-reduce, ZeRO's and FSDP2's reductions over
the world already do) while the loss normaliser, advantages and sample slices are computed over
the data-parallel group only (train/sp.py).

Heads: the query heads must divide by N. Key/value heads that do not (GQA: Qwen2.5-VL-3B has 2
for 16 query heads) are repeated up to N when N is a multiple of their count, so each rank gets
one whole group; any other split raises at install (`check_heads`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as torch_dist

from mmrl.models import prefix_attention
from mmrl.models.forward import check_no_placeholders, collate, upcast
from mmrl.models.media_embeds import (KINDS, Provider, balanced_ranges, encode, encoder_modules,
                                      media_units, select_units, splice_media)
from mmrl.models.shared_prefix import (MASKED_ATTENTION, SP_PREFIX, Packed, attn_implementation,
                                       _takes_logits_index, group_attention_mask, group_rows,
                                       pack_groups, rope_positions, token_index, unwrap,
                                       uses_varlen)
from mmrl.models.towers import model_parts


@dataclass(frozen=True)
class SPGroup:
    """This process's sequence-parallel group: `size` ranks holding the same micro-batch."""

    group: object = None  # torch.distributed ProcessGroup (None: size 1)
    rank: int = 0
    size: int = 1


_STATE = {"sp": SPGroup()}  # the process's SP group (one per process), set by `install`

# ----------------------------------------------------------------------------- collectives ------


def _all_to_all(x: torch.Tensor, sp: SPGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk j of `x` along scatter_dim goes to rank j; the chunks received are concatenated
    along gather_dim in rank order."""
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    torch_dist.all_to_all_single(recv, send, group=sp.group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sp, scatter_dim, gather_dim):
        ctx.sp, ctx.dims = sp, (scatter_dim, gather_dim)
        return _all_to_all(x, sp, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), ctx.sp, gather_dim, scatter_dim), None, None, None


class _GatherParts(torch.autograd.Function):
    """Every rank's [n_r, D] part concatenated in rank order. Backward: each rank used the whole
    result differently (its own token shard), so a part's gradient is the sum over ranks."""

    @staticmethod
    def forward(ctx, x, sp):
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(sp.size)]
        torch_dist.all_gather(sizes, torch.tensor([x.shape[0]]), group=sp.group)
        counts = [int(s) for s in sizes]
        padded = x.new_zeros(max(counts), *x.shape[1:])
        padded[:x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(sp.size)]
        torch_dist.all_gather(parts, padded.contiguous(), group=sp.group)
        ctx.sp, ctx.counts = sp, counts
        return torch.cat([p[:c] for p, c in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        torch_dist.all_reduce(grad, group=ctx.sp.group)
        start = sum(ctx.counts[:ctx.sp.rank])
        return grad[start:start + ctx.counts[ctx.sp.rank]], None


class _ReplicatedSum(torch.autograd.Function):
    """Sum of every rank's tensor. Backward: the identity, because what follows (the loss) is
    computed identically on every rank: each rank's part gets the loss's gradient once."""

    @staticmethod
    def forward(ctx, x, sp):
        out = x.clone()
        torch_dist.all_reduce(out, group=sp.group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ----------------------------------------------------------------------------- attention --------

def check_heads(model, size: int) -> None:
    """ValueError unless the text decoder's heads split over `size` ranks (see module doc)."""
    text = unwrap(model).config.get_text_config()
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads % size:
        raise ValueError(f"train.sequence_parallel={size}: the model has {heads} attention heads, "
                         f"which do not split over {size} ranks; use a divisor of {heads}")
    if kv % size and size % kv:
        raise ValueError(f"train.sequence_parallel={size}: the model has {kv} key/value heads; "
                         f"use a degree that divides them or a multiple of them (repeated)")


# Kernels that transformers does not register: each family's modeling file defines its own.
_FAMILY_KERNELS = {"eager": lambda module: sys.modules[type(module).__module__].eager_attention_forward}


def _inner_function(inner: str, module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    own = _FAMILY_KERNELS.get(inner)
    return own(module) if own else ALL_ATTENTION_FUNCTIONS[inner]


class _GroupsView:
    """`module` as the inner kernel sees it, with num_key_value_groups fitting the local heads."""

    def __init__(self, module, groups: int):
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _ulysses(inner: str):
    def attention(module, query, key, value, attention_mask, **kwargs):
        sp, fn = _STATE["sp"], _inner_function(inner, module)
        # Sharded calls carry the whole sequence's mask over this rank's slice of keys.
        if (sp.size == 1 or not torch.is_tensor(attention_mask) or attention_mask.ndim != 4
                or attention_mask.shape[-1] != sp.size * key.shape[2]):
            return fn(module, query, key, value, attention_mask, **kwargs)
        b, h, t, d = query.shape
        kv = key.shape[1]
        if kv % sp.size:  # GQA with fewer kv heads than ranks: one repeated group per rank
            key = key.repeat_interleave(sp.size // kv, dim=1)
            value = value.repeat_interleave(sp.size // kv, dim=1)
        hk = key.shape[1] // sp.size
        qkv = torch.cat([x.reshape(b, sp.size, -1, t, x.shape[-1]) for x in (query, key, value)], 2)
        full = _AllToAll.apply(qkv, sp, 1, 3)[:, 0]  # [B, h/N + 2 hk, T, D]
        q, k, v = full.split([h // sp.size, hk, hk], dim=1)
        view = module if (h // sp.size) // hk == getattr(module, "num_key_value_groups", 1) \
            else _GroupsView(module, (h // sp.size) // hk)
        out, _ = fn(view, q, k, v, attention_mask, **kwargs)  # [B, T, h/N, D]
        return _AllToAll.apply(out.contiguous(), sp, 1, 2), None  # [B, t, h, D]
    return attention


SUPPORTED_INNER = ("sdpa", "eager", prefix_attention.NAME)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for inner in SUPPORTED_INNER:
        AttentionInterface.register(SP_PREFIX + inner, _ulysses(inner))
        mask_of = prefix_attention.base_kernel() if inner == prefix_attention.NAME else inner
        AttentionMaskInterface.register(SP_PREFIX + inner, ALL_MASK_ATTENTION_FUNCTIONS[mask_of])


_register()


def install(model, sp: SPGroup) -> str:
    """Run `model`'s text decoder on Ulysses attention over `sp` (after `enable_shared_prefix`
    picked the layout's kernel); returns one line for the log. Idempotent; size 1 changes
    nothing."""
    _STATE["sp"] = sp
    if sp.size == 1:
        return "sequence parallelism off (train.sequence_parallel=1)"
    check_heads(model, sp.size)
    inner = attn_implementation(model)
    if inner not in SUPPORTED_INNER:
        raise ValueError(f"train.sequence_parallel={sp.size} runs attention on the whole sequence "
                         f"with a 4-D mask; model.attn_implementation={inner!r} takes none. Use "
                         f"sdpa or eager, or flash_attention_2 with train.shared_prefix=true (its "
                         f"varlen kernel)")
    _, decoder = model_parts(unwrap(model))
    decoder.set_attn_implementation(SP_PREFIX + inner)
    return f"sequence parallelism: {sp.size} ranks per sequence, Ulysses all-to-all over {inner}"


# ----------------------------------------------------------------------------- media ------------

class ShardedEncoder:
    """media_embeds Provider: this rank encodes its contiguous share of the units (balanced by
    encoder input rows) and every rank gets all embeddings. `touch`: a rank with no unit still
    runs the encoder (on one unit, times 0), for ZeRO-3 / FSDP2 whose per-module collectives
    need every rank to run every module."""

    def __init__(self, sp: SPGroup, touch: bool = False):
        self.sp, self.touch = sp, touch

    def __call__(self, owner, kind: str, tensors: dict) -> torch.Tensor:
        units = media_units(kind, tensors)
        lo, hi = balanced_ranges([u.cost for u in units], self.sp.size)[self.sp.rank]
        if lo < hi:
            mine = encode(owner, kind, select_units(kind, tensors, units[lo:hi]))
        elif self.touch:
            dummy = encode(owner, kind, select_units(kind, tensors, units[:1]))
            mine = dummy[:0] + 0.0 * dummy.sum()
        else:
            width = owner.config.get_text_config().hidden_size
            mine = torch.zeros(0, width, device=next(owner.parameters()).device)
            # As the other ranks' parts: the gather's backward (a collective) runs on every
            # rank exactly when the encoder trains.
            trains = any(p.requires_grad for m in encoder_modules(owner, kind).values()
                         for p in m.parameters())
            mine.requires_grad_(trains and torch.is_grad_enabled())
        return _GatherParts.apply(mine, self.sp)


# ----------------------------------------------------------------------------- forward ----------

def naive_packed(model, prompts, completion_ids, completion_mask, pad_id: int) -> Packed:
    """The naive layout (`forward.collate`: left-padded prompts, completions appended) as a
    Packed with explicit positions and a 4-D mask, which a sharded forward needs."""
    inputs = collate(prompts, completion_ids, completion_mask, pad_id)
    inputs.pop("logits_to_keep")
    valid = inputs["attention_mask"].bool()
    inputs["position_ids"] = rope_positions(model, inputs)
    inputs["attention_mask"] = group_attention_mask(torch.zeros_like(inputs["input_ids"]), valid)
    n, length = completion_ids.shape
    width = inputs["input_ids"].shape[1]
    keep = torch.arange(width - length - 1, width - 1)
    lengths = completion_mask.long().sum(1).tolist()
    return Packed(inputs, keep, list(range(n)), [torch.arange(c) for c in lengths], lengths,
                  1.0 - float(valid.float().mean()))


def _pad_sequence(inputs: dict, extra: int, pad_id: int) -> dict:
    """Right-pad every sequence tensor by `extra` positions: pads see only themselves."""
    if not extra:
        return inputs
    out = dict(inputs)
    out["input_ids"] = torch.nn.functional.pad(inputs["input_ids"], (0, extra), value=pad_id)
    out["position_ids"] = torch.nn.functional.pad(inputs["position_ids"], (0, extra))
    if "mm_token_type_ids" in inputs:
        out["mm_token_type_ids"] = torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, extra))
    mask = inputs["attention_mask"]
    if mask.shape[2] == 1:  # varlen segment ids: -1 is neither a query nor a key
        out["attention_mask"] = torch.nn.functional.pad(mask, (0, extra), value=-1)
    else:
        t = mask.shape[-1] + extra
        padded = torch.zeros(*mask.shape[:2], t, t, dtype=torch.bool)
        padded[..., :mask.shape[-2], :mask.shape[-1]] = mask
        padded[..., range(t - extra, t), range(t - extra, t)] = True
        out["attention_mask"] = padded
    return out


def sequence_parallel_logprobs(model, prompts: Sequence, completion_ids: torch.Tensor,
                               completion_mask: torch.Tensor, sp: SPGroup, *, shared_prefix: bool,
                               temperature: float = 1.0, return_entropy: bool = False,
                               placeholder_ids: Sequence[int] = (), pad_id: int = 0,
                               provider: Provider | None = None, stats: dict | None = None):
    """Same contract as `shared_prefix_logprobs` (shared_prefix=True) or `completion_logprobs`
    on `collate(...)` (False; values where the mask is 0 are 0 here): [N, L] float32 logprobs
    (and entropies), identical on every rank of `sp`, differentiable, with this rank computing
    1/N of the sequence. `provider` supplies the media embeddings (default: ShardedEncoder)."""
    check_no_placeholders(completion_ids, completion_mask, placeholder_ids)
    text = unwrap(model).config.get_text_config()
    if _STATE["sp"] is not sp or not text._attn_implementation.startswith(SP_PREFIX):
        raise ValueError("sequence_parallel_logprobs: call ulysses.install(model, sp) first "
                         "(with this SPGroup)")
    ids, mask = completion_ids.cpu(), completion_mask.cpu()
    packed = (pack_groups(model, prompts, ids, mask, pad_id, varlen=uses_varlen(model))
              if shared_prefix else naive_packed(model, prompts, ids, mask, pad_id))
    if stats is not None:
        stats["pad_fraction"] = packed.pad_fraction
        stats["rows_per_pack"] = len(packed.lengths) / len(group_rows(prompts))
    width = packed.inputs["input_ids"].shape[1]
    shard = -(-width // sp.size)
    inputs = _pad_sequence(packed.inputs, shard * sp.size - width, pad_id)
    lo, hi = sp.rank * shard, (sp.rank + 1) * shard
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    to_mask = MASKED_ATTENTION.get(attn_implementation(model))
    if to_mask is not None:
        inputs["attention_mask"] = to_mask(inputs["attention_mask"], dtype)
    # The encoder inputs stay where they are: each rank moves only its share (ShardedEncoder).
    heavy = {KINDS[kind][0] for kind in KINDS}
    inputs = {k: v if k in heavy else v.to(device) for k, v in inputs.items()}
    # This rank's kept positions: a contiguous run keep[first:last] (keep is sorted).
    first = int(torch.searchsorted(packed.keep, lo))
    last = int(torch.searchsorted(packed.keep, hi))
    local_keep = (packed.keep[first:last] - lo).to(device)
    with splice_media(model, provider or ShardedEncoder(sp), shard=(lo, hi)):
        if _takes_logits_index(model):
            logits = model(**inputs, logits_to_keep=local_keep, use_cache=False).logits
        else:  # Qwen2-Audio, Qwen2.5-Omni: every local position, then select
            logits = model(**inputs, use_cache=False).logits[:, local_keep]
    n, length = completion_ids.shape
    rows, cols, slots = token_index(packed, length, device)
    mine = (cols >= first) & (cols < last)
    scaled = upcast(logits[rows[mine], cols[mine] - first]) / temperature
    lse = torch.logsumexp(scaled, dim=-1)
    targets = completion_ids.to(device).flatten()[slots[mine]]
    # 0 x the logits: every rank's graph reaches its decoder even when it keeps no token, so
    # the backward's all-to-alls run on every rank.
    anchor = 0.0 * logits.sum()

    def gathered(values):
        local = values.new_zeros(n * length).index_put((slots[mine],), values) + anchor
        return _ReplicatedSum.apply(local, sp).view(n, length)

    logp = gathered(scaled.gather(-1, targets[:, None]).squeeze(-1) - lse)
    if not return_entropy:
        return logp
    return logp, gathered(lse - (torch.softmax(scaled, dim=-1) * scaled).sum(-1))


__all__ = ["SPGroup", "ShardedEncoder", "check_heads", "install", "naive_packed",
           "sequence_parallel_logprobs"]
