"""The HF rollout engine: the training model's own `generate` (mmrl.models.forward.generate)."""
from __future__ import annotations

from typing import Sequence

from mmrl.models.forward import Generation, generate
from mmrl.models.shared_generate import generate_shared
from mmrl.types import PromptFeatures


class HFEngine:
    """Samples with the training model itself, so there are never weights to sync."""

    def __init__(self, model, processor, eos_ids: Sequence[int] | None = None, *,
                 shared_prefill: bool = False, rounds_of: int | None = None):
        self.model, self.processor = model, processor
        self.eos_ids = None if eos_ids is None else list(eos_ids)
        # shared_prefill: prefill each prompt once and decode its G samples from that cache (in
        # rounds of `rounds_of` to bound memory); same distribution, different draws than HF's.
        self.shared_prefill, self.rounds_of = shared_prefill, rounds_of

    def generate(self, prompts: Sequence[PromptFeatures], *, num_generations: int = 1,
                 max_new_tokens: int = 64, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, do_sample: bool = True, suppress_ids: Sequence[int] = (),
                 seed: int | None = None, eos_ids: Sequence[int] | None = None) -> Generation:
        was_training = self.model.training
        self.model.eval()
        kwargs = dict(num_generations=num_generations, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k, do_sample=do_sample,
                      suppress_ids=suppress_ids, seed=seed,
                      eos_ids=self.eos_ids if eos_ids is None else eos_ids)
        try:
            if self.shared_prefill:
                return generate_shared(self.model, self.processor, prompts,
                                       rounds_of=self.rounds_of, **kwargs)
            return generate(self.model, self.processor, prompts, **kwargs)
        finally:
            self.model.train(was_training)

    def sync_weights(self, model) -> None:
        if model is not self.model:
            raise ValueError("HFEngine samples from the model it was built with; build a new "
                             "engine to sample from another model")

    def close(self) -> None:
        pass
