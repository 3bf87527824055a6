"""Frozen encoders run once per prompt per step.

A step runs each prompt's forward several times: the old logprobs (num_iterations > 1, or the
KL in the reward), the KL reference, and every update iteration; a group's prompt runs once per
forward under the shared-prefix layout, G times under the naive one. When a media encoder is
frozen (`model.freeze: [vision]`, or LoRA on the language model only), its output for a prompt
is the same in every one of those forwards, and in the reference model too: frozen towers are
the weights the reference started from. So the first forward of the step that meets a prompt
encodes it (without a graph) and every later one takes the stored embeddings through
media_embeds.splice_media; the numbers are the same (tests/models/test_encoder_cache.py).

An encoder that trains is never cached (its output changes with every update and carries the
gradient); `EncoderCache.reason` says which kinds are cached and why the others are not, for the
start-of-run summary. Entries are keyed by the PromptFeatures' tensors (a group's rows share them)
and live until `clear()`, which the trainer calls at the start of each step. Under ZeRO-3 and
FSDP2 an encoder call is a collective, so the step starts with `fill` (every rank encodes its
prompts, one call per prompt and kind) and the TowerToucher skips the cached kinds. Under
sequence parallelism the ranks of a group hold the same prompts, and `fill` shards each one's
units over them (each rank encodes 1/N, as the uncached split forward does).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import torch

from mmrl.models.media_embeds import (KINDS, Provider, encoder_modules, kind_tensors,
                                      local_encoder, owner_of, splice_media)
from mmrl.models.shared_prefix import group_rows
from mmrl.types import PromptFeatures

# Each encoder and the media kinds it encodes.
TOWERS = {"vision": ("images", "videos"), "audio": ("audios",)}


def _dropout(module: torch.nn.Module) -> float:
    config = getattr(module, "config", None)
    return max(float(getattr(config, k, 0.0) or 0.0)
               for k in ("dropout", "attention_dropout", "activation_dropout"))


def cacheable_kinds(model) -> tuple[list[str], list[str]]:
    """(media kinds whose encoder output can be cached, one reason per encoder that cannot)."""
    owner = owner_of(model)
    kinds, why = [], []
    for tower, tower_kinds in TOWERS.items():
        modules = encoder_modules(owner, tower_kinds[0])
        if not modules:
            continue
        training = [f"{attr}.{n}" for attr, m in modules.items()
                    for n, p in m.named_parameters() if p.requires_grad]
        if training:
            why.append(f"the {tower} encoder trains ({training[0]} and {len(training) - 1} more; "
                       f"model.freeze: [{tower}] freezes it, LoRA leaves it frozen by default)")
        elif max(_dropout(m) for m in modules.values()) > 0:
            why.append(f"the {tower} encoder has dropout (its output is random in training)")
        elif any(getattr(getattr(m, "config", None), "deepstack_visual_indexes", None)
                 for m in modules.values()):  # Qwen3-VL: media_embeds.encode refuses them
            why.append(f"the {tower} encoder also feeds deepstack features into the first "
                       f"language layers (Qwen3-VL), which the cache does not carry yet")
        else:
            kinds += tower_kinds
    return kinds, why


def media_order(prompts: Sequence[PromptFeatures], shared_prefix: bool) -> list[PromptFeatures]:
    """The prompts whose media a forward over `prompts` concatenates, in order: one per row
    (forward.collate), or one per group (shared_prefix.pack_groups)."""
    return [prompts[rows[0]] for rows in group_rows(prompts)] if shared_prefix else list(prompts)


class EncoderCache:
    """Per-step store of frozen encoders' outputs; `serve` / `provider` put them to use."""

    def __init__(self, model, enabled: bool = True, off: str = "train.cache_frozen_encoders=false"):
        """`enabled=False`: nothing is cached, for the reason `off`."""
        if enabled:
            self.kinds, why = cacheable_kinds(model)
        else:
            self.kinds, why = [], [f"off ({off})"]
        towers = [t for t, kinds in TOWERS.items() if kinds[0] in self.kinds]
        done = f"{' and '.join(towers)} encoder output cached once per prompt per step" if towers else ""
        self.reason = "; ".join([done] * bool(done) + [f"not cached: {w}" for w in why])
        self.reason = self.reason or "no media encoder"
        # The start-of-run line: which way this run's encoders go, then why.
        training = any("trains" in w for w in why)
        self.summary = "encoders: " + ("cached once per step (frozen)" if self.on else
                                       "run in every forward" + " (they train)" * training)
        self.summary += f" -- {self.reason}"
        self._store: dict[int, tuple[PromptFeatures, dict[str, torch.Tensor]]] = {}
        self.encoded = self.served = 0  # prompt-kinds encoded / served from the store

    @property
    def on(self) -> bool:
        return bool(self.kinds)

    def clear(self) -> None:
        """Forget every entry (at the start of a step: the next one brings new prompts)."""
        self._store.clear()

    def provider(self, prompts: Sequence[PromptFeatures], shared_prefix: bool,
                 inner: Provider = local_encoder) -> Provider:
        """A splice_media provider for one forward over `prompts` (its rows): cached kinds come
        from the store (encoded by `inner` on first use), the others from `inner` directly."""
        order = media_order(prompts, shared_prefix)

        def provide(owner, kind: str, tensors: dict) -> torch.Tensor:
            if kind not in self.kinds:
                return inner(owner, kind, tensors)
            parts = []
            for prompt in order:
                if KINDS[kind][0] in prompt.tensors:
                    parts.append(self._features(owner, kind, prompt, inner))
            return torch.cat(parts)
        return provide

    def fill(self, model, prompts: Sequence[PromptFeatures], dummies: dict | None = None,
             inner: Provider = local_encoder) -> None:
        """Encode every cached kind of `prompts` now (each distinct prompt once, one call per
        prompt and kind, through `inner`: under sequence parallelism ulysses.ShardedEncoder, so
        each rank of the group encodes its share of the units and all get the whole), so the
        step's forwards run no cached encoder at all. With `dummies`
        (TowerToucher.dummies) a prompt without a kind runs that encoder on the dummy instead:
        under ZeRO-3 / FSDP2 every rank then calls each encoder equally often (ranks hold the
        same number of prompts), as their per-module collectives need."""
        owner = owner_of(model)
        for prompt in {id(p.tensors): p for p in prompts}.values():
            for kind in self.kinds:
                if KINDS[kind][0] in prompt.tensors:
                    self._features(owner, kind, prompt, inner)
                elif dummies is not None and kind in dummies:
                    with torch.no_grad():
                        local_encoder(owner, kind, dummies[kind])

    def serve(self, model, prompts: Sequence[PromptFeatures], shared_prefix: bool):
        """Context for one forward of `model` over `prompts` (nothing when no kind is cached)."""
        if not self.on:
            return nullcontext()
        return splice_media(model, self.provider(prompts, shared_prefix))

    def _features(self, owner, kind: str, prompt: PromptFeatures, inner: Provider) -> torch.Tensor:
        # Keyed by the tensors, which the runs of a split group share (shared_prefix.split_groups);
        # the object kept, so ids stay unique.
        _, entry = self._store.setdefault(id(prompt.tensors), (prompt, {}))
        if kind not in entry:
            with torch.no_grad():
                entry[kind] = inner(owner, kind, kind_tensors(prompt.tensors, kind))
            self.encoded += 1
        else:
            self.served += 1
        return entry[kind]
