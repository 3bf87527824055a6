"""The rollout-engine contract: sample G completions per prompt, and take new weights.

Every engine returns `mmrl.models.forward.Generation` with rows group-major (rows g*G .. g*G+G-1
belong to prompts[g]) and `sampler_logp` = log p(sampled token) under softmax(logits / T) of the
unmodified model, i.e. before top-p/top-k truncation and placeholder bans: the quantity the
trainer's `completion_logprobs` recomputes, so the two can be compared (or IS-corrected).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from mmrl.models.forward import Generation
from mmrl.types import PromptFeatures


@runtime_checkable
class RolloutEngine(Protocol):
    # True: generates with the training model itself (its weights must be whole while it runs;
    # nothing to sync). False: holds its own copy of the weights, reloaded after each update.
    samples_from_training_model: bool

    def generate(self, prompts: Sequence[PromptFeatures], *, num_generations: int,
                 max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                 do_sample: bool, suppress_ids: Sequence[int], seed: int | None = None) -> Generation:
        """G completions per prompt (see the module docstring for the layout)."""

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (a no-op for HF, which samples
        from the training model itself)."""

    def close(self) -> None:
        """Release the engine's memory and temporary files (idempotent)."""


def _option(section: Any, key: str, default):
    if section is None:
        return default
    if isinstance(section, dict):
        return section.get(key, default)
    return getattr(section, key, default)


def make_engine(cfg_rollout, model, processor, adapter) -> RolloutEngine:
    """The engine `cfg_rollout.backend` names: "hf" (the training model's own generate) or
    "vllm" (a colocated vLLM engine; options from `cfg_rollout.vllm`, a dataclass or dict, if
    present). With `vllm.server_url` set, a client of a running `vllm serve` instead."""
    backend = getattr(cfg_rollout, "backend", "hf")
    if backend == "hf":
        from mmrl.rollout.hf import HFEngine

        return HFEngine(model, processor,
                        shared_prefill=getattr(cfg_rollout, "shared_prefill", False),
                        rounds_of=getattr(cfg_rollout, "rounds_of", None))
    if backend == "vllm":
        opts = getattr(cfg_rollout, "vllm", None)
        url = _option(opts, "server_url", None)
        if url:
            from mmrl.rollout.vllm_server import VLLMServerEngine

            return VLLMServerEngine(
                url, processor, adapter,
                weight_transfer=_option(opts, "weight_transfer", "auto"),
                weight_transfer_port=_option(opts, "weight_transfer_port", 51216))
        from mmrl.rollout.vllm import VLLMEngine

        return VLLMEngine(
            model, processor, adapter,
            gpu_memory_utilization=_option(opts, "gpu_memory_utilization", 0.3),
            tensor_parallel_size=_option(opts, "tensor_parallel_size", 1),
            enable_sleep_mode=_option(opts, "enable_sleep_mode", False),
            max_model_len=_option(opts, "max_model_len", None),
            enforce_eager=_option(opts, "enforce_eager", True),
            seed=_option(opts, "seed", 0),
            weight_transfer=_option(opts, "weight_transfer", "auto"),
            llm_kwargs=dict(_option(opts, "llm_kwargs", None) or {}))
    raise ValueError(f"rollout.backend must be 'hf' or 'vllm', got {backend!r}")
