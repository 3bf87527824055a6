"""Decode on a static KV cache with a step compiled once per (rows, cache length) bucket.

Eager HF decoding of a small or mid-size model is bound by Python and kernel launches, not by
the arithmetic: every token runs the whole module tree, rebuilds the attention mask and grows a
dynamic cache by concatenation. Here the prompt is prefilled eagerly as before (media encoder
included), its KV copied (each row repeated G times) into transformers' `StaticCache` of a
bucketed length, and each further token runs one `torch.compile`d function: the text decoder
plus the LM head over that fixed-shape cache (CUDA graphs on GPU via mode="reduce-overhead").

The positions are the ones `shared_generate` already computes per row (M-RoPE included, so the
rope deltas of Qwen2-VL / 2.5-VL / 3-VL are in them), passed explicitly; the mask is a
fixed-width 2-D buffer whose columns are switched on as tokens are written. A new (rows, cache
length, dtype, device) is a new compile: lengths are bucketed (`cache_length`) so a run
compiles a few times, each compile is timed and logged, and past `max_compiles` a new shape runs
the same static-cache step uncompiled and says so (never a silent fallback).
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from contextlib import contextmanager

import torch

from mmrl.models.forward import upcast
from mmrl.models.shared_prefix import unwrap

log = logging.getLogger(__name__)

# torch.compile's backend. Tests set "eager": dynamo still captures the whole step (fullgraph,
# so a graph break fails them) but skips inductor's code generation, tens of seconds on CPU;
# `mmrl bench --which decode` runs inductor and checks its greedy tokens against eager.
BACKEND = "inductor"


def compile_blocker(model_class) -> str | None:
    """Why `model_class` (a class or an instance) cannot decode compiled, or None if it can.
    Asks the class itself: transformers marks the families whose forward cannot be captured
    whole (`_can_compile_fullgraph = False`, e.g. Qwen2-Audio)."""
    cls = model_class if isinstance(model_class, type) else type(unwrap(model_class))
    if not getattr(cls, "_can_compile_fullgraph", False):
        return (f"{cls.__name__} sets _can_compile_fullgraph = False (transformers cannot "
                f"capture its forward whole)")
    return None


def _gqa_with_mask(attention_mask, key, value) -> bool:
    """transformers' sdpa path repeats a grouped-query layer's K/V heads (a copy of the whole
    cache per layer and step) whenever a mask is given, for CUDA's kernels' sake; torch's CPU
    sdpa takes `enable_gqa` with a mask, reading the cache in place (same values, tested)."""
    return True


@contextmanager
def _cpu_gqa(device: torch.device):
    """While decoding compiled on CPU: sdpa with enable_gqa and the mask (see _gqa_with_mask)."""
    if device.type != "cpu":
        yield
        return
    from transformers.integrations import sdpa_attention

    saved, sdpa_attention.use_gqa_in_sdpa = sdpa_attention.use_gqa_in_sdpa, _gqa_with_mask
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = saved


def _step(decoder, head, ids, positions, mask, cache):
    """One token per row through the text decoder over the static cache; logits upcast as the
    eager path upcasts them."""
    out = decoder(input_ids=ids, position_ids=positions, attention_mask=mask,
                  past_key_values=cache, use_cache=True)
    return upcast(head(out.last_hidden_state[:, -1]))


class CompiledDecoder:
    """Owns the compiled step, the static caches (one per bucket, most recent `keep_caches`
    kept: a cache's tensors have static addresses the compiled graph is specialised on) and the
    compile bookkeeping (`stats()`)."""

    def __init__(self, model, *, bucket: int = 64, mode: str | None = None,
                 backend: str | None = None, max_compiles: int = 8, keep_caches: int = 2):
        self.model, self.bucket = model, bucket
        base = unwrap(model)
        self.decoder, self.head = base.get_decoder(), base.get_output_embeddings()
        self.text_config = base.config.get_text_config()
        self.max_compiles, self.keep_caches = max_compiles, keep_caches
        self.compiled = torch.compile(_step, backend=backend or BACKEND, mode=mode, fullgraph=True,
                                      dynamic=False)
        self.caches: OrderedDict = OrderedDict()
        self.shapes: set = set()  # every shape compiled so far
        self.compiles, self.recompiles, self.compile_s, self.eager_steps = 0, 0, 0.0, 0

    def cache_length(self, tokens: int) -> int:
        """The static cache's length for `tokens`: rounded up to a multiple of a quarter of its
        power of two (at least `bucket`), so at most 4 lengths an octave compile and the
        attention reads at most ~25% (usually less) beyond the tokens held: 317 -> 320,
        1300 -> 1536 (bucket 64)."""
        step = max(self.bucket, 1 << max(tokens.bit_length() - 3, 0))
        return -(-tokens // step) * step

    def session(self, prefill_cache, attention_mask: torch.Tensor, repeats: int,
                max_new_tokens: int) -> "DecodeSession":
        """A decode over `prefill_cache` (a prefilled DynamicCache of the prompts' rows, left
        intact) with every row repeated `repeats` times, group-major."""
        width = attention_mask.shape[1]
        n = attention_mask.shape[0] * repeats
        length = self.cache_length(width + max_new_tokens)
        first = prefill_cache.layers[0].keys
        key = (n, length, first.dtype, first.device)
        cache = self._cache(key)
        for layer, src in zip(cache.layers, prefill_cache.layers):
            k, v = (src.keys.repeat_interleave(repeats, 0), src.values.repeat_interleave(repeats, 0))
            if not layer.is_initialized:
                layer.lazy_initialization(k, v)
            layer.keys[:, :, :width].copy_(k)
            layer.values[:, :, :width].copy_(v)
            layer.cumulative_length.fill_(width)
        mask = attention_mask.new_zeros(n, length)
        mask[:, :width] = attention_mask.repeat_interleave(repeats, 0)
        return DecodeSession(self, key, cache, mask, width)

    def _cache(self, key):
        from transformers import StaticCache

        if key in self.caches:
            self.caches.move_to_end(key)
            return self.caches[key]
        while len(self.caches) >= self.keep_caches:
            self.caches.popitem(last=False)
        self.caches[key] = StaticCache(config=self.text_config, max_cache_len=key[1])
        return self.caches[key]

    def run(self, key, ids, positions, mask, cache) -> torch.Tensor:
        """The step for one shape: compiled (timed and counted on a new shape), or, past
        max_compiles, the same function uncompiled (counted, warned once per shape)."""
        import torch._dynamo.utils as dynamo_utils

        new = key not in self.shapes
        if new and self.compiles >= self.max_compiles:
            if self.eager_steps == 0:
                log.warning("compiled decode: %d shapes compiled already (max_compiles); shape "
                            "%s decodes uncompiled", self.compiles, key[:2])
            self.eager_steps += 1
            with _cpu_gqa(ids.device):
                return _step(self.decoder, self.head, ids, positions, mask, cache)
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        t = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=self.max_compiles + 1), \
                _cpu_gqa(ids.device):
            logits = self.compiled(self.decoder, self.head, ids, positions, mask, cache)
        if new:
            self.shapes.add(key)
            self.compiles += 1
            self.compile_s += time.perf_counter() - t
            log.info("compiled decode: shape %d rows x %d cache tokens compiled in %.1f s "
                     "(%d so far)", key[0], key[1], time.perf_counter() - t, self.compiles)
        elif dynamo_utils.counters["stats"]["unique_graphs"] > graphs:
            self.recompiles += 1  # a guard failed on a known shape: count it, say it
            log.warning("compiled decode: recompiled for shape %s (%d unexpected recompiles)",
                        key[:2], self.recompiles)
        return logits

    def stats(self) -> dict[str, float]:
        return {"decode/compiles": self.compiles, "decode/recompiles": self.recompiles,
                "decode/compile_s": self.compile_s, "decode/uncompiled_steps": self.eager_steps}


class DecodeSession:
    """One decode: writes token `step` at cache column width + step and returns the logits."""

    def __init__(self, owner: CompiledDecoder, key, cache, mask: torch.Tensor, width: int):
        self.owner, self.key, self.cache, self.mask, self.width = owner, key, cache, mask, width

    def __call__(self, chosen: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
        self.mask[:, self.width + step] = 1
        # contiguous: the slice's strides depend on max_new_tokens, and dynamo guards on them
        return self.owner.run(self.key, chosen[:, None].contiguous(), positions.contiguous(),
                              self.mask, self.cache)

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.cache.layers
                   for t in (layer.keys, layer.values))
