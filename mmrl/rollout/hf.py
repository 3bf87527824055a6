"""The HF rollout engine: the training model's own `generate` (mmrl.models.forward.generate), or
mmrl's own decode loop (mmrl.models.shared_generate) with each prompt prefilled once and, where
rollout.compile_decode resolves on, each token's step compiled over a static KV cache
(mmrl.models.compiled_decode)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import torch

from mmrl.config_rules import resolve_compile_decode
from mmrl.models.compiled_decode import CompiledDecoder, compile_blocker
from mmrl.models.forward import Generation, generate
from mmrl.models.shared_generate import generate_shared
from mmrl.types import PromptFeatures, SamplingParams

log = logging.getLogger(__name__)


def decode_path(model_class, compile_decode: str, cuda: bool) -> tuple[bool, str]:
    """(compiled, one line saying which decode runs and why) for a model class (or instance)."""
    compiled, why = resolve_compile_decode(compile_decode, compile_blocker(model_class), cuda)
    what = "compiled static-cache step" if compiled else "eager"
    return compiled, f"decode: {what} ({why})"


def family_decode_path(family: str, compile_decode: str) -> str:
    """The config summary's line for a model family before any model is built: which decode
    runs and why (the model is placed on CUDA when there is one). Raises ValueError for
    compile_decode=compiled where the family cannot compile (validate reports it)."""
    import transformers

    from mmrl.models import get_adapter

    cls = getattr(transformers, get_adapter(family).model_class)
    return decode_path(cls, compile_decode, torch.cuda.is_available())[1]


class HFEngine:
    """Samples with the training model itself, so there are never weights to sync."""
    samples_from_training_model = True

    def __init__(self, model, processor, eos_ids: Sequence[int] | None = None, *,
                 shared_prefill: bool = False, rounds_of: int | None = None,
                 compile_decode: str = "eager"):
        self.model, self.processor = model, processor
        self.eos_ids = None if eos_ids is None else list(eos_ids)
        # shared_prefill: prefill each prompt once and decode its G samples from that cache (in
        # rounds of `rounds_of` to bound memory); same distribution, different draws than HF's.
        self.shared_prefill, self.rounds_of = shared_prefill, rounds_of
        cuda = next(model.parameters()).device.type == "cuda"
        compiled, self.decode_path = decode_path(model, compile_decode, cuda)
        # The compiled step runs in mmrl's decode loop (generate_shared), each prompt prefilled
        # once and its KV copied to its G rows: the samples a per-row prefill gives (tested),
        # for a G-th of the prefill; CUDA graphs on a GPU.
        self.decoder = (CompiledDecoder(model, mode="reduce-overhead" if cuda else None)
                        if compiled else None)
        self.timing: dict = {}  # prefill / decode seconds and counts summed since take_timing
        log.info(self.decode_path)

    @classmethod
    def from_config(cls, rollout, model, processor) -> "HFEngine":
        """From a RolloutConfig (its shared_prefill, rounds_of and compile_decode)."""
        return cls(model, processor, shared_prefill=rollout.shared_prefill,
                   rounds_of=rollout.rounds_of, compile_decode=rollout.compile_decode)

    def generate(self, prompts: Sequence[PromptFeatures],
                 sampling: SamplingParams = SamplingParams()) -> Generation:
        was_training = self.model.training
        self.model.eval()
        if sampling.eos_ids is None and self.eos_ids is not None:
            sampling = dataclasses.replace(sampling, eos_ids=self.eos_ids)
        stats: dict = {}
        try:
            if self.shared_prefill or self.decoder is not None:
                return generate_shared(self.model, self.processor, prompts, sampling,
                                       rounds_of=self.rounds_of, stats=stats,
                                       decoder=self.decoder)
            return generate(self.model, self.processor, prompts, sampling, stats=stats)
        finally:
            self.model.train(was_training)
            for k in ("prefill_s", "decode_s", "decode_forwards", "kv_read_bytes"):
                self.timing[k] = self.timing.get(k, 0) + stats.get(k, 0)

    def take_timing(self) -> dict:
        """Prefill / decode seconds, decode forwards and KV bytes read, summed over the calls
        since the last take (a step's calls: several with tools), plus the compile counts."""
        out, self.timing = {**self.timing, **self.decode_stats()}, {}
        return out

    def decode_stats(self) -> dict[str, float]:
        """The compiled step's compile counts and seconds so far (empty when eager)."""
        return self.decoder.stats() if self.decoder is not None else {}

    def sync_weights(self, model) -> None:
        if model is not self.model:
            raise ValueError("HFEngine samples from the model it was built with; build a new "
                             "engine to sample from another model")

    def close(self) -> None:
        self.decoder = None
