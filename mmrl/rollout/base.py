"""The rollout-engine contract: sample G completions per prompt, and take new weights.

Every engine returns `mmrl.models.forward.Generation` with rows group-major (rows g*G .. g*G+G-1
belong to prompts[g]) and `sampler_logp` = log p(sampled token) under softmax(logits / T) of the
unmodified model, i.e. before top-p/top-k truncation and placeholder bans: the quantity the
trainer's `completion_logprobs` recomputes, so the two can be compared (or IS-corrected).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from mmrl.models.codec import Codec
from mmrl.models.forward import Generation
from mmrl.types import PromptFeatures, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    # True: generates with the training model itself (its weights must be whole while it runs;
    # nothing to sync). False: holds its own copy of the weights, reloaded after each update.
    samples_from_training_model: bool

    def generate(self, prompts: Sequence[PromptFeatures], sampling: SamplingParams) -> Generation:
        """`sampling.num_generations` completions per prompt (see the module docstring for the
        layout)."""

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (a no-op for HF, which samples
        from the training model itself)."""

    def close(self) -> None:
        """Release the engine's memory and temporary files (idempotent)."""


def make_engine(cfg_rollout, model, codec: Codec) -> RolloutEngine:
    """The engine `cfg_rollout.backend` (a RolloutConfig) names: "hf" (the training model's own
    generate) or "vllm" (a colocated vLLM engine built from `cfg_rollout.vllm`; with
    `vllm.server_url` set, a client of a running `vllm serve` instead). Each engine reads its
    own options from the config object; the defaults live in mmrl/config.py only."""
    return ENGINES[cfg_rollout.backend](cfg_rollout, model, codec)


def _hf_engine(cfg_rollout, model, codec: Codec) -> RolloutEngine:
    from mmrl.rollout.hf import HFEngine

    return HFEngine.from_config(cfg_rollout, model, codec.processor)


def _vllm_engine(cfg_rollout, model, codec: Codec) -> RolloutEngine:
    if cfg_rollout.vllm.server_url:
        from mmrl.rollout.vllm_server import VLLMServerEngine

        return VLLMServerEngine.from_config(cfg_rollout.vllm, codec)
    from mmrl.rollout.vllm import VLLMEngine

    return VLLMEngine.from_config(cfg_rollout.vllm, model, codec)


# The engine builder per rollout.backend; imported lazily (vLLM is an optional dependency).
ENGINES = {"hf": _hf_engine, "vllm": _vllm_engine}
