"""The records that flow through mmrl: Sample -> RolloutBatch -> ScoredBatch.

Shapes are given in trailing comments: N = rows (B prompts x G samples), L = completion length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

# Every audio waveform in mmrl is mono float32 at this rate: Whisper-style feature extractors
# (Qwen2-Audio, Qwen2.5-Omni) assume 16 kHz, and another rate is misread silently.
AUDIO_SAMPLING_RATE = 16000


@dataclass
class Video:
    """Sampled frames of one video (a record's decoded clip, a tool's or an environment's).

    `fps` is the SAMPLING rate (frames of `frames` per second of video time), which the processor
    needs for M-RoPE time alignment (Qwen2.5-VL: second_per_grid_ts = 2 / fps); it is not the
    file's native rate. `timestamps` are the shown frames' times in seconds from the file start.
    """

    frames: np.ndarray  # [T, H, W, 3] uint8, T even
    fps: float
    timestamps: list[float]
    duration: float  # seconds, whole file
    path: str = ""

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    def processor_metadata(self) -> dict:
        """`video_metadata` entry for a transformers video processor called with
        `do_sample_frames=False`: its `sampled_fps` then equals `self.fps` (without metadata,
        transformers 5.19 assumes 24 fps and time positions come out wrong)."""
        t, h, w = self.frames.shape[:3]
        return {"total_num_frames": int(t), "fps": float(self.fps), "frames_indices": list(range(t)),
                "duration": t / self.fps, "width": int(w), "height": int(h)}


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
    # Function specs for a chat template that renders `tools` (set by the tools environment's
    # reset, mmrl/rollout/tool_env.py); None: the template gets none.
    chat_tools: list[dict] | None = None


@dataclass
class PromptFeatures:
    """The one processor call for one sample: unpadded tensors with a leading batch dim of 1 for
    token-aligned keys (input_ids, attention_mask, mm_token_type_ids) and concatenable media
    tensors (pixel_values [patches, D], image_grid_thw [n_images, 3], input_features, ...)."""

    sample: Sample
    tensors: dict[str, torch.Tensor]
    media: dict[str, list] | None = None  # the decoded media, for engines that take raw media
    # The record before the environment's reset (mmrl/envs): what each trajectory's environment
    # is reset with. None: `sample` itself.
    record: Sample | None = None

    @property
    def input_ids(self) -> torch.Tensor:  # [P]
        return self.tensors["input_ids"][0]


@dataclass
class ToolCallRecord:
    """One tool call of a trajectory, as parsed from a model turn and answered."""

    name: str  # the tool named ("" when the call could not be parsed)
    arguments: dict[str, Any]  # as parsed ({} when the call could not be parsed)
    turn: int  # 0-based model turn that made the call
    error: str | None = None  # the error kind its observation reported (None: the tool answered)
    seconds: float = 0.0  # wall time of the tool
    message: str = ""  # the error message the model read ("" when the tool answered)
    # What of the original media the call read, as the tool said (tools.base.looked_at): e.g.
    # {"media": "image", "path", "size", "box"} in original pixels; what the report draws.
    seen: list[dict] = field(default_factory=list)


@dataclass
class Observation:
    """One observation turn inside a trajectory's completion: tokens the processor produced from
    the rendered tool results (placeholders expanded), never sampled by the policy.

    `tensors` holds the observation's media tensors (pixel_values, image_grid_thw,
    pixel_values_videos, ..., concatenable along dim 0 like PromptFeatures') and
    "mm_token_type_ids" [length] for the M-RoPE families. `text` is the rendered turn before the
    processor (one placeholder per media item, what a vLLM engine takes), `media` the raw items
    (PIL images, Video, waveforms) in order, for engines and the report."""

    start: int  # first token of the observation in the completion
    length: int  # its token count
    tensors: dict[str, torch.Tensor]
    text: str = ""
    media: dict[str, list] = field(default_factory=dict)


@dataclass
class Trajectory:
    """What one multi-turn row holds besides its tokens."""

    observations: list[Observation] = field(default_factory=list)  # in completion order
    turns: int = 1  # model turns
    turn_texts: list[str] = field(default_factory=list)  # each model turn, decoded
    calls: list[ToolCallRecord] = field(default_factory=list)
    hit_turn_cap: bool = False  # still calling tools when max_turns ran out
    # The environment's Step.info, merged turn by turn (mmrl/envs); rewards get it as `info`.
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def observation_tokens(self) -> int:
        return sum(o.length for o in self.observations)


@dataclass
class RolloutBatch:
    prompts: list[PromptFeatures]  # one per row (shared objects within a group)
    completion_ids: torch.Tensor  # [N, L] right-padded with pad id
    completion_mask: torch.Tensor  # [N, L] 1 on completion tokens up to and including EOS
    group_ids: torch.Tensor  # [N] int64, equal within a prompt's G samples
    sampler_logp: torch.Tensor | None  # [N, L] logprobs under the sampling policy (may be None)
    texts: list[str]  # [N] decoded completions (special tokens skipped); a trajectory's final turn
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens (or the trajectory budget) without EOS
    # Multi-turn rows (tool use): the completion holds model turns and observation turns in order;
    # completion_mask covers both (attention), loss_mask only the model's tokens (what the policy
    # sampled), sampler_logp is 0 on observations. None: single-turn (loss_mask = completion_mask).
    loss_mask: torch.Tensor | None = None  # [N, L]
    trajectories: list[Trajectory] | None = None  # [N]

    @property
    def n(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def policy_mask(self) -> torch.Tensor:
        """[N, L] 1 on the tokens the policy sampled: what losses, KL and IS weights average over."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def hit_turn_cap(self) -> torch.Tensor:
        """[N] bool: trajectories still calling tools at max_turns (all False for single-turn);
        with tools.mask_truncated_trajectories they leave the loss, like DAPO's overlong rows."""
        if self.trajectories is None:
            return torch.zeros(self.n, dtype=torch.bool)
        return torch.tensor([t.hit_turn_cap for t in self.trajectories], dtype=torch.bool)

    def observations(self) -> list[list[Observation]] | None:
        """Per row, its observation turns in order (None for single-turn batches)."""
        return None if self.trajectories is None else [t.observations for t in self.trajectories]

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
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
            trajectories=None if self.trajectories is None else [self.trajectories[i]
                                                                 for i in idx.tolist()],
        )

    @classmethod
    def cat(cls, batches: Sequence["RolloutBatch"], pad_id: int) -> "RolloutBatch":
        """Rows of `batches` in order, completions re-padded to the widest. Single-turn and
        multi-turn batches mix: a single-turn row's loss mask is its completion mask and its
        trajectory one turn without tools."""
        width = max(b.completion_ids.shape[1] for b in batches)

        def pad(t: torch.Tensor, value) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        with_slogp = all(b.sampler_logp is not None for b in batches)
        multi = any(b.trajectories is not None for b in batches)
        return cls(
            prompts=[p for b in batches for p in b.prompts],
            completion_ids=torch.cat([pad(b.completion_ids, pad_id) for b in batches]),
            completion_mask=torch.cat([pad(b.completion_mask, 0) for b in batches]),
            group_ids=torch.cat([b.group_ids for b in batches]),
            sampler_logp=torch.cat([pad(b.sampler_logp, 0.0) for b in batches])
            if with_slogp else None,
            texts=[t for b in batches for t in b.texts],
            truncated=torch.cat([b.truncated for b in batches]),
            loss_mask=torch.cat([pad(b.policy_mask, 0) for b in batches]) if multi else None,
            trajectories=[t for b in batches for t in (
                b.trajectories or [Trajectory(turn_texts=[x]) for x in b.texts])] if multi else None,
        )


@dataclass
class ScoredBatch:
    rollout: RolloutBatch
    scores: torch.Tensor  # [N] weighted total reward
    per_reward: dict[str, list[float | None]]  # name -> [N] raw scores (None = not applicable)
    advantages: torch.Tensor  # [N]
    old_logp: torch.Tensor | None = None  # [N, L] policy logprobs at rollout time (num_iterations > 1)
    ref_logp: torch.Tensor | None = None  # [N, L] reference-model logprobs (beta > 0)
