"""The HF rollout engine: the training model's own `generate` (mmrl.models.forward.generate)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from mmrl.models.forward import Generation, generate
from mmrl.models.shared_generate import generate_shared
from mmrl.types import PromptFeatures, SamplingParams


class HFEngine:
    """Samples with the training model itself, so there are never weights to sync."""

    def __init__(self, model, processor, eos_ids: Sequence[int] | None = None, *,
                 shared_prefill: bool = False, rounds_of: int | None = None):
        self.model, self.processor = model, processor
        self.eos_ids = None if eos_ids is None else list(eos_ids)
        # shared_prefill: prefill each prompt once and decode its G samples from that cache (in
        # rounds of `rounds_of` to bound memory); same distribution, different draws than HF's.
        self.shared_prefill, self.rounds_of = shared_prefill, rounds_of

    @classmethod
    def from_config(cls, rollout, model, processor) -> "HFEngine":
        """From a RolloutConfig (its shared_prefill and rounds_of)."""
        return cls(model, processor, shared_prefill=rollout.shared_prefill,
                   rounds_of=rollout.rounds_of)

    def generate(self, prompts: Sequence[PromptFeatures],
                 sampling: SamplingParams = SamplingParams()) -> Generation:
        was_training = self.model.training
        self.model.eval()
        if sampling.eos_ids is None and self.eos_ids is not None:
            sampling = dataclasses.replace(sampling, eos_ids=self.eos_ids)
        try:
            if self.shared_prefill:
                return generate_shared(self.model, self.processor, prompts, sampling,
                                       rounds_of=self.rounds_of)
            return generate(self.model, self.processor, prompts, sampling)
        finally:
            self.model.train(was_training)

    def sync_weights(self, model) -> None:
        if model is not self.model:
            raise ValueError("HFEngine samples from the model it was built with; build a new "
                             "engine to sample from another model")

    def close(self) -> None:
        pass
