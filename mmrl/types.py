"""The records that flow through mmrl: Sample -> RolloutBatch -> ScoredBatch.

Shapes are given in trailing comments: N = rows (B prompts x G samples), L = completion length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

# Every audio waveform in mmrl is mono float32 at this rate: Whisper-style feature extractors
# (Qwen2-Audio, Qwen2.5-Omni) assume 16 kHz, and another rate is misread silently.
AUDIO_SAMPLING_RATE = 16000


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions: the one record every `generate` takes (HF, shared-prefix, vLLM
    colocated and server), so a new knob is added here once, not to each signature."""

    num_generations: int = 1  # G completions per prompt; rows come back group-major
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    do_sample: bool = True  # False = greedy
    suppress_ids: Sequence[int] = ()  # never sampled (media placeholders)
    seed: int | None = None  # reproducible draws without touching the global RNG stream
    eos_ids: Sequence[int] | None = None  # stop tokens; None = the model's / engine's own

    @classmethod
    def from_rollout(cls, rollout, **overrides) -> "SamplingParams":
        """From a RolloutConfig (rollout.num_generations, max_new_tokens, temperature, top_p,
        top_k); `overrides` set the rest (suppress_ids, do_sample, ...)."""
        keys = ("num_generations", "max_new_tokens", "temperature", "top_p", "top_k")
        return cls(**{k: getattr(rollout, k) for k in keys}, **overrides)


@dataclass
class Sample:
    """One training/eval record after format adaptation, before any processor call.

    `messages` is an HF chat: [{"role": "user", "content": [{"type": "image"}, {"type": "text",
    "text": "..."}]}]; media items are referenced by position in `images`/`videos`/`audios` (paths).
    """

    id: str
    messages: list[dict]
    solution: Any = None
    task: str = "default"
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    audios: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # options, duration, image size, ...
    source: str = ""  # "file:line" for error messages


@dataclass
class PromptFeatures:
    """The one processor call for one sample: unpadded tensors with a leading batch dim of 1 for
    token-aligned keys (input_ids, attention_mask, mm_token_type_ids) and concatenable media
    tensors (pixel_values [patches, D], image_grid_thw [n_images, 3], input_features, ...)."""

    sample: Sample
    tensors: dict[str, torch.Tensor]
    media: dict[str, list] | None = None  # the decoded media, for engines that take raw media

    @property
    def input_ids(self) -> torch.Tensor:  # [P]
        return self.tensors["input_ids"][0]


@dataclass
class RolloutBatch:
    prompts: list[PromptFeatures]  # one per row (shared objects within a group)
    completion_ids: torch.Tensor  # [N, L] right-padded with pad id
    completion_mask: torch.Tensor  # [N, L] 1 on generated tokens up to and including EOS
    group_ids: torch.Tensor  # [N] int64, equal within a prompt's G samples
    sampler_logp: torch.Tensor | None  # [N, L] logprobs under the sampling policy (may be None)
    texts: list[str]  # [N] decoded completions (special tokens skipped)
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without EOS

    @property
    def n(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: list[int] | torch.Tensor) -> "RolloutBatch":
        idx = torch.as_tensor(rows, dtype=torch.long)
        return RolloutBatch(
            prompts=[self.prompts[i] for i in idx.tolist()],
            completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx],
            group_ids=self.group_ids[idx],
            sampler_logp=None if self.sampler_logp is None else self.sampler_logp[idx],
            texts=[self.texts[i] for i in idx.tolist()],
            truncated=self.truncated[idx],
        )


@dataclass
class ScoredBatch:
    rollout: RolloutBatch
    scores: torch.Tensor  # [N] weighted total reward
    per_reward: dict[str, list[float | None]]  # name -> [N] raw scores (None = not applicable)
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor | None = None  # [N, L] policy logprobs at rollout time (num_iterations > 1)
    ref_logp: torch.Tensor | None = None  # [N, L] reference-model logprobs (beta > 0)
