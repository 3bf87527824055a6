"""What one block of a model keeps for backward, counted by autograd on the `meta` device.

The memory model (memory.py) needs the bytes a text decoder layer, a vision block and an audio
encoder layer save for backward per token. Rather than a hand formula per family (and per
transformers version), this runs one real block of the real architecture on meta tensors (no
memory, no compute) under `saved_tensors_hooks` and sums what autograd saves, excluding the
weights and the tensors every layer shares (rotary cos/sin).

The one thing replaced is the attention kernel: on meta, sdpa would fall back to the math path,
which saves the whole score matrix. A memory-efficient kernel (flash, sdpa's efficient and flash
backends, varlen) saves its inputs, its output and one log-sum-exp per query and head; the shim
registered here saves exactly those, so the count is that of a fused kernel.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

PROBE_TOKENS = 64  # activations are linear in the token count (fused attention keeps no T^2)
SHIM = "mmrl_probe"


class _FusedAttention(torch.autograd.Function):
    """Forward shape of attention, saving what a fused kernel saves (q, k, v, out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - never differentiated (meta only)
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _shim(module, query, key, value, attention_mask=None, **kwargs):
    """transformers attention-interface signature; q/k/v [B, H, T, D] -> ([B, T, H, D], None).
    GQA: k/v are expanded to the query heads when a mask is given, as transformers' sdpa path
    does (repeat_kv); mask-free calls keep them unexpanded (sdpa's enable_gqa)."""
    if attention_mask is not None and key.shape[1] != query.shape[1]:
        n = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(n, 1), value.repeat_interleave(n, 1)
    out = _FusedAttention.apply(query, key, value)
    return out.transpose(1, 2).contiguous(), None  # the copy o_proj saves, as sdpa's path makes


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(SHIM, _shim)
    AttentionMaskInterface.register(SHIM, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@dataclass
class BlockCost:
    """Bytes one block saves for backward per token (text) / patch (vision) / frame (audio),
    and the width of its input (what gradient checkpointing keeps per block instead)."""

    saved_per_token: float
    width: int
    count: int  # blocks of this kind in the model
    intermediate: int  # MLP width: no-grad forwards peak at a few tensors this wide

    def nograd_per_token(self, b: int) -> int:
        """Bytes per token live inside one block in a no-grad forward (prefill, reference
        logprobs): at most three MLP intermediates (gate, up, their product) and a few
        hidden-width tensors; nothing is kept after the block."""
        return (3 * self.intermediate + 4 * self.width) * b


def _saved_bytes(block, run, shared: list[torch.Tensor]) -> int:
    params = {p.untyped_storage()._cdata for p in block.parameters()}
    skip = params | {t.untyped_storage()._cdata for t in shared}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in skip and key not in seen:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _set_attention(module) -> None:
    config = getattr(module, "config", None)
    if config is not None:
        config._attn_implementation = SHIM


def _first_block(owner, blocks: str):
    """The first block of `owner.<blocks>`, its attention switched to the fused-kernel shim."""
    block = getattr(owner, blocks)[0]
    for m in block.modules():
        _set_attention(m)
    return block


def _text(model, dtype) -> BlockCost:
    lm = _find(model, "language_model") or _find(model, "model")
    layer = _first_block(lm, "layers")
    h = lm.config.hidden_size
    x = torch.empty(1, PROBE_TOKENS, h, device="meta", dtype=dtype, requires_grad=True)
    pos = torch.arange(PROBE_TOKENS, device="meta")[None]
    rope = getattr(lm.config, "rope_parameters", None) or {}
    if "mrope_section" in rope:  # M-RoPE families take (3, B, T) positions
        pos = pos[None].expand(3, 1, -1)
    cos_sin = lm.rotary_emb(x, pos)
    cos_sin = tuple(t.to(dtype) for t in cos_sin)
    saved = _saved_bytes(layer, lambda: layer(x, attention_mask=None, position_ids=pos,
                                              position_embeddings=cos_sin), list(cos_sin))
    return BlockCost(saved / PROBE_TOKENS, h, len(lm.layers), lm.config.intermediate_size)


def _vision(model, dtype) -> BlockCost | None:
    visual = _find(model, "visual")
    if visual is None:
        return None
    block = _first_block(visual, "blocks")
    width = getattr(visual.config, "embed_dim", None) or visual.config.hidden_size  # Qwen2-VL
    heads = visual.config.num_heads
    x = torch.empty(PROBE_TOKENS, width, device="meta", dtype=dtype, requires_grad=True)
    cu = torch.tensor([0, PROBE_TOKENS], dtype=torch.int32)  # host: the block reads its values
    rot = torch.empty(PROBE_TOKENS, width // heads, device="meta", dtype=torch.float32)
    kwargs = {"cu_seqlens": cu}
    names = inspect.signature(block.forward).parameters
    if "position_embeddings" in names:
        kwargs["position_embeddings"] = (rot.cos(), rot.sin())
    if "rotary_pos_emb" in names:
        kwargs["rotary_pos_emb"] = rot[:, : rot.shape[1] // 2]
    shared = [t for v in kwargs.values() for t in (v if isinstance(v, tuple) else (v,))
              if t.device.type == "meta"]
    saved = _saved_bytes(block, lambda: block(x, **kwargs), shared)
    vc = visual.config
    mlp = getattr(vc, "intermediate_size", None) or int(getattr(vc, "mlp_ratio", 4) * width)
    return BlockCost(saved / PROBE_TOKENS, width, len(visual.blocks), mlp)


def _audio(model, dtype) -> BlockCost | None:
    tower = _find(model, "audio_tower")
    if tower is None:
        return None
    layer = _first_block(tower, "layers")
    width = tower.config.d_model
    names = inspect.signature(layer.forward).parameters
    if "cu_seqlens" in names:  # Omni: packed [T, C] with window boundaries
        x = torch.empty(PROBE_TOKENS, width, device="meta", dtype=dtype, requires_grad=True)
        kwargs = {"cu_seqlens": torch.tensor([0, PROBE_TOKENS], dtype=torch.int32)}
    else:  # Qwen2-Audio: [B, T, C] with a mask
        x = torch.empty(1, PROBE_TOKENS, width, device="meta", dtype=dtype, requires_grad=True)
        kwargs = {"attention_mask": None}
    saved = _saved_bytes(layer, lambda: layer(x, **kwargs), [])
    return BlockCost(saved / PROBE_TOKENS, width, len(tower.layers), tower.config.encoder_ffn_dim)


def _find(model, name: str):
    """The first submodule called `name` (towers sit under `model.` or at the top level)."""
    for path, module in model.named_modules():
        if path.split(".")[-1] == name:
            return module
    return None


def block_costs(model, dtype: torch.dtype) -> dict[str, BlockCost]:
    """{"text", "vision", "audio"}: saved bytes per token of one block of each kind of `model`
    (a meta-device model, e.g. shapes.build(name, device="meta")) in training dtype `dtype`."""
    _register()
    model = model.to(dtype)
    with torch.enable_grad():
        out = {"text": _text(model, dtype)}
        for kind, fn in (("vision", _vision), ("audio", _audio)):
            cost = fn(model, dtype)
            if cost is not None:
                out[kind] = cost
    return out


__all__ = ["BlockCost", "block_costs"]
