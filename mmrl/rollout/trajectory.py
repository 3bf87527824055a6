"""The trajectory loop: every rollout, in training, the SFT warm-up and evaluation, is a
trajectory of model turns and environment steps, on any rollout engine.

Each trajectory has its own environment instance (mmrl/envs; built by its kind,
mmrl/rollout/environments.py and tool_env.py). After each model turn the environment steps: its
Step ends the trajectory (`done`), or gives the next observation, a user turn (text, images,
video, audio) or the tools' results, encoded by the processor on the new content only.
Single-turn is the environment done after the first turn: its batch is that first generation
itself, bit for bit what the engine returned (no trajectories, no loss mask).

Turn 1 samples G trajectories per prompt; every later turn continues each trajectory by one
`engine.generate` call over its whole sequence so far (prompt, model turns, observations, with
all their media), one sample per row. On the HF engine that prefill runs `get_rope_index` over
the whole sequence, as the training forward does, so positions agree by construction; the
colocated vLLM engine places them with the same `get_rope_index` (worker_ext.py) and gets the
trajectory's media in sequence order (vllm_io.build_request). A trajectory ends when its
environment says so (the tools: a final answer, or a turn without a call), at `max_turns` (the
turn cap: a turn still calling tools there is not answered), when a turn is cut without its end
token (no step then), or when the next observation does not fit the trajectory's token budget --
that observation and its media are then dropped whole, so no cut ever falls inside one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from mmrl.models.codec import Codec
from mmrl.models.forward import upcast
from mmrl.models.trajectory import (ObservationStyle, completion_token_types, encode_observation,
                                    observation_style, row_media)
from mmrl.rollout.tool_env import ToolEnvironments, encode_tool_turn
from mmrl.tools import Toolbox, as_content, as_items
from mmrl.tools.base import MediaLimits
from mmrl.types import Observation, PromptFeatures, RolloutBatch, SamplingParams, Trajectory

@dataclass(frozen=True)
class TrajectorySettings:
    call_format: str = "qwen"  # tools.call_format
    max_turns: int = 4  # model turns per trajectory
    max_tokens: int = 1024  # completion tokens of a trajectory: model and observation turns
    max_observation_tokens: int = 512  # one observation turn; longer: a too_long error instead

    @classmethod
    def from_config(cls, tc, evaluation: bool = False) -> "TrajectorySettings":
        """From a ToolsConfig or EnvConfig; `evaluation` uses its eval_max_turns (may exceed
        max_turns)."""
        turns = tc.eval_max_turns if evaluation and tc.eval_max_turns else tc.max_turns
        return cls(call_format=getattr(tc, "call_format", "qwen"), max_turns=turns,
                   max_tokens=tc.max_tokens, max_observation_tokens=tc.max_observation_tokens)

    @classmethod
    def for_run(cls, cfg, evaluation: bool = False) -> "TrajectorySettings":
        """A run's budgets: tools.* with tools, env.* for a user environment; single-turn is one
        turn, bounded by the turn's max_new_tokens alone."""
        if cfg.tools.enabled:
            return cls.from_config(cfg.tools, evaluation)
        if cfg.multi_turn:
            return cls.from_config(cfg.env, evaluation)
        return cls(max_turns=1, max_tokens=1 << 40)


USER_TURN = ObservationStyle("user", False, "observations: user turns")


@dataclass
class _Row:
    """One trajectory being generated."""

    prompt: PromptFeatures
    env: object  # its environment instance
    ids: list[torch.Tensor] = field(default_factory=list)  # completion pieces in order
    logp: list[torch.Tensor] = field(default_factory=list)
    policy: list[torch.Tensor] = field(default_factory=list)  # 1 on model tokens
    record: Trajectory = field(default_factory=lambda: Trajectory(turns=0))
    truncated: bool = False
    done: bool = False

    @property
    def length(self) -> int:
        return sum(int(p.shape[0]) for p in self.ids)

    def add(self, ids: torch.Tensor, logp: torch.Tensor | None) -> None:
        self.ids.append(ids.long().cpu())
        model = logp is not None
        self.logp.append(upcast(logp).cpu() if model else torch.zeros(ids.shape[0]))
        self.policy.append(torch.full((ids.shape[0],), int(model), dtype=torch.long))


class TrajectoryRollout:
    """Trajectories on `engine` (anything with `generate(prompts, sampling)`, the RolloutEngine
    contract) with the environments `envs` (an environment kind, mmrl/rollout/environments.py;
    a Toolbox means the tools); `codec` renders and encodes observation turns;
    `limits` guard a user environment's observation media (the records' rules)."""

    def __init__(self, engine, codec: Codec, envs,
                 settings: TrajectorySettings = TrajectorySettings(),
                 limits: MediaLimits = MediaLimits()):
        if isinstance(envs, Toolbox):
            envs = ToolEnvironments(envs, codec, settings.call_format)
        self.engine, self.codec = engine, codec
        self.envs, self.settings, self.limits = envs, settings, limits
        self.tokenizer = codec.tokenizer
        self.style: ObservationStyle = observation_style(codec.processor)

    @property
    def toolbox(self) -> Toolbox | None:
        return getattr(self.envs, "toolbox", None)

    @classmethod
    def from_config(cls, tc, engine, codec: Codec,
                    evaluation: bool = False, data=None) -> "TrajectoryRollout":
        """With tools, from a ToolsConfig (its tools, call format, budgets; eval_max_turns when
        `evaluation`) over any rollout engine; `data` (a DataConfig) gives the tools' results
        the records' media limits."""
        return cls(engine, codec, Toolbox.from_config(tc, data),
                   TrajectorySettings.from_config(tc, evaluation))

    @classmethod
    def for_run(cls, cfg, engine, codec: Codec, envs,
                evaluation: bool = False) -> "TrajectoryRollout":
        """The run's loop over `engine` with its environment kind `envs` (built once per run:
        environments.make_environments) and budgets (TrajectorySettings.for_run)."""
        d = cfg.data
        limits = MediaLimits(frames=d.video_max_frames, audio_seconds=d.audio_max_seconds)
        return cls(engine, codec, envs, TrajectorySettings.for_run(cfg, evaluation), limits)

    def rollout(self, prompts: Sequence[PromptFeatures], sampling: SamplingParams,
                group_offset: int = 0) -> RolloutBatch:
        """G trajectories per prompt as a RolloutBatch (rows group-major): completion = model
        and observation turns, `loss_mask` 1 on model tokens, `sampler_logp` 0 on observations,
        `texts` the final turns, `trajectories` the rest. Single-turn: the first generation."""
        g = sampling.num_generations
        envs = self.envs.start(prompts, g, self.settings.max_turns)
        rows = [_Row(prompt=p, env=e)
                for p, e in zip([p for p in prompts for _ in range(g)], envs)]
        turn, first = 0, None
        try:
            while turn == 0 or not all(r.done for r in rows):
                active = [r for r in rows if not r.done]
                gen = self._turn(active, turn, sampling, first=turn == 0, prompts=prompts)
                first = gen if turn == 0 else first
                self._step([r for r in active if not r.done])
                turn += 1
        finally:
            self.envs.close(envs)
        if not self.envs.trajectories:
            return self._plain(prompts, first, rows, group_offset, g)
        return self._batch(rows, group_offset, g)

    # ------------------------------------------------------------------------ turns ---------

    def _turn(self, rows: list[_Row], turn: int, sampling: SamplingParams, *, first: bool,
              prompts: Sequence[PromptFeatures]):
        s = self.settings
        left = [s.max_tokens - r.length for r in rows]
        limit = min(sampling.max_new_tokens, max(left, default=sampling.max_new_tokens))
        seed = None if sampling.seed is None else sampling.seed + 7919 * turn
        if first:
            params = dataclasses.replace(sampling, max_new_tokens=limit, seed=seed)
            gen = self.engine.generate(list(prompts), params)
        else:
            params = dataclasses.replace(sampling, num_generations=1, max_new_tokens=limit,
                                         seed=seed)
            gen = self.engine.generate([continuation(r.prompt, r.ids, r.record.observations)
                                        for r in rows], params)
        for i, row in enumerate(rows):
            keep = gen.completion_mask[i].bool()
            ids, logp = gen.completion_ids[i][keep], gen.sampler_logp[i][keep]
            cut = bool(gen.truncated[i])
            if ids.shape[0] > left[i]:  # past this row's own budget: cut there
                ids, logp, cut = ids[:left[i]], logp[:left[i]], True
            row.add(ids, logp)
            row.record.turns += 1
            row.record.turn_texts.append(self.tokenizer.decode(ids, skip_special_tokens=True))
            if cut:  # no step: the turn was not finished
                row.truncated = row.done = True
        return gen

    def _step(self, rows: list[_Row]) -> None:
        """Every row's environment answers its last turn (all at once), then each row ends or
        gets its observation turn."""
        if not rows:
            return
        steps = self.envs.step([r.env for r in rows], [r.record for r in rows],
                               [r.record.turn_texts[-1] for r in rows])
        for row, step in zip(rows, steps):
            row.record.info.update(step.info)
            if step.done:
                row.done = True
            elif row.record.turns >= self.settings.max_turns:
                row.record.hit_turn_cap = row.done = True
            else:
                OBSERVE[step.role](self, row, step.observation)

    def encode(self, results, media: dict, after: str, start: int,
               style: ObservationStyle) -> tuple[torch.Tensor, Observation]:
        return encode_observation(self.codec, results, media, after, start, style)

    def append_observation(self, row: _Row, ids: torch.Tensor, obs: Observation) -> None:
        """The observation joins the row, or, when no model token would fit after it, the row
        ends (the observation and its media dropped whole)."""
        if row.length + obs.length + 1 > self.settings.max_tokens:
            row.truncated = row.done = True
            return
        row.add(ids, None)
        row.record.observations.append(obs)

    # ------------------------------------------------------------------------ batch ---------

    def _plain(self, prompts, gen, rows: list[_Row], group_offset: int, g: int) -> RolloutBatch:
        """The single-turn batch: the engine's own tensors, as it returned them."""
        return RolloutBatch(
            prompts=[p for p in prompts for _ in range(g)], completion_ids=gen.completion_ids,
            completion_mask=gen.completion_mask, texts=[r.record.turn_texts[0] for r in rows],
            truncated=gen.truncated, sampler_logp=gen.sampler_logp,
            group_ids=torch.arange(len(prompts)).repeat_interleave(g) + group_offset)

    def _batch(self, rows: list[_Row], group_offset: int, g: int) -> RolloutBatch:
        pad_id = self.tokenizer.pad_token_id
        width = max(1, max(r.length for r in rows))

        def stack(pieces, value, dtype):
            return torch.stack([torch.nn.functional.pad(
                torch.cat(p).to(dtype) if p else torch.zeros(0, dtype=dtype),
                (0, width - sum(int(x.shape[0]) for x in p)), value=value) for p in pieces])

        ids = stack([r.ids for r in rows], pad_id, torch.long)
        lengths = torch.tensor([r.length for r in rows])
        mask = (torch.arange(width)[None] < lengths[:, None]).long()
        return RolloutBatch(
            prompts=[r.prompt for r in rows], completion_ids=ids, completion_mask=mask,
            group_ids=torch.arange(len(rows)) // g + group_offset,
            sampler_logp=stack([r.logp for r in rows], 0.0, _logp_dtype(rows)),
            texts=[r.record.turn_texts[-1] if r.record.turn_texts else "" for r in rows],
            truncated=torch.tensor([r.truncated for r in rows]),
            loss_mask=stack([r.policy for r in rows], 0, torch.long),
            trajectories=[r.record for r in rows])


def encode_user_turn(loop: TrajectoryRollout, row: _Row, observation: list) -> None:
    """A user environment's observation as a user turn (text, images, video, audio items, under
    the records' media guards). One over max_observation_tokens ends the row (info
    observation_too_long), as does one the trajectory's budget cannot hold."""
    s = loop.settings
    try:
        items = as_items(observation, loop.limits)
    except TypeError as e:
        raise TypeError(f"env {getattr(loop.envs, 'name', '')}: its observation: {e}") from None
    chars = sum(len(x) for x in items if isinstance(x, str))
    if chars <= s.max_observation_tokens * loop.codec.token_chars:
        content, media = as_content(items)
        after = loop.tokenizer.decode(row.ids[-1][-1:])
        ids, obs = loop.encode([content], media, after, row.length, USER_TURN)
        if obs.length <= s.max_observation_tokens:
            loop.append_observation(row, ids, obs)
            return
    row.record.info["observation_too_long"] = True
    row.truncated = row.done = True


# How a Step's observation becomes a turn, by its role (mmrl/envs/base.py Step.role).
OBSERVE = {"user": encode_user_turn, "tool": encode_tool_turn}


def _logp_dtype(rows) -> torch.dtype:
    """float32, or float64 when the engine sampled in float64 (tests that tell rounding apart)."""
    return torch.float64 if any(p.dtype == torch.float64 for r in rows for p in r.logp) \
        else torch.float32


def continuation(prompt: PromptFeatures, pieces: Sequence[torch.Tensor],
                 observations: Sequence[Observation]) -> PromptFeatures:
    """A trajectory so far as a prompt to continue: the prompt's tokens and every completion
    piece, token types over the observations' media, the media tensors in sequence order, and
    the raw media (prompt's, then the observations') for engines that take raw media."""
    completion = torch.cat(list(pieces)) if pieces else torch.zeros(0, dtype=torch.long)
    ids = torch.cat([prompt.tensors["input_ids"][0], completion.to(prompt.tensors["input_ids"])])
    attn = prompt.tensors.get("attention_mask", torch.ones_like(prompt.tensors["input_ids"]))[0]
    tensors = {"input_ids": ids[None],
               "attention_mask": torch.cat([attn, attn.new_ones(completion.shape[0])])[None]}
    if "mm_token_type_ids" in prompt.tensors:
        types = completion_token_types(observations, completion.shape[0])
        tensors["mm_token_type_ids"] = torch.cat([prompt.tensors["mm_token_type_ids"][0],
                                                  types])[None]
    tensors.update(row_media(prompt.tensors, observations))
    media = {k: list(v) for k, v in (prompt.media or {}).items()}
    for o in observations:
        for kind, items in o.media.items():
            media.setdefault(kind, []).extend(items)
    return PromptFeatures(sample=prompt.sample, tensors=tensors, media=media)
