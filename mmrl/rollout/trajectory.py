"""Multi-turn rollouts: the model generates a turn, its tool calls run, their results come back
as the next (observation) turn, and generation continues -- on any rollout engine.

Turn 1 samples G trajectories per prompt; every later turn continues each trajectory by one
`engine.generate` call over its whole sequence so far (prompt, model turns, observations, with
all their media), one sample per row. On the HF engine that prefill runs `get_rope_index` over
the whole sequence, as the training forward does, so positions agree by construction; the
colocated vLLM engine places them with the same `get_rope_index` (worker_ext.py) and gets the
trajectory's media in sequence order (vllm_io.build_request). A
trajectory ends on a final answer (or a turn without a call), at `max_turns` (the turn cap: a
turn still calling tools there is not answered), when a turn is cut without its end token, or
when the next observation does not fit the trajectory's token budget -- that observation and its
media are then dropped whole, so no cut ever falls inside one.
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
from mmrl.tools import Toolbox, ToolContext, as_content, error_text, parse_turn
from mmrl.tools.calls import ToolCall
from mmrl.tools.toolbox import Outcome
from mmrl.types import Observation, PromptFeatures, RolloutBatch, SamplingParams, Trajectory


@dataclass(frozen=True)
class TrajectorySettings:
    call_format: str = "qwen"  # tools.call_format
    max_turns: int = 4  # model turns per trajectory
    max_tokens: int = 1024  # completion tokens of a trajectory: model and observation turns
    max_observation_tokens: int = 512  # one observation turn; longer: a too_long error instead

    @classmethod
    def from_config(cls, tc, evaluation: bool = False) -> "TrajectorySettings":
        """From a ToolsConfig; `evaluation` uses tools.eval_max_turns (may exceed max_turns)."""
        turns = tc.eval_max_turns if evaluation and tc.eval_max_turns else tc.max_turns
        return cls(call_format=tc.call_format, max_turns=turns, max_tokens=tc.max_tokens,
                   max_observation_tokens=tc.max_observation_tokens)


@dataclass
class _Row:
    """One trajectory being generated."""

    prompt: PromptFeatures
    context: ToolContext
    offered: list[str]
    ids: list[torch.Tensor] = field(default_factory=list)  # completion pieces in order
    logp: list[torch.Tensor] = field(default_factory=list)
    policy: list[torch.Tensor] = field(default_factory=list)  # 1 on model tokens
    record: Trajectory = field(default_factory=lambda: Trajectory(turns=0))
    truncated: bool = False
    done: bool = False
    pending: list[ToolCall] = field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(int(p.shape[0]) for p in self.ids)

    def add(self, ids: torch.Tensor, logp: torch.Tensor | None) -> None:
        self.ids.append(ids.long().cpu())
        model = logp is not None
        self.logp.append(upcast(logp).cpu() if model else torch.zeros(ids.shape[0]))
        self.policy.append(torch.full((ids.shape[0],), int(model), dtype=torch.long))


class TrajectoryRollout:
    """Trajectories with tools on `engine` (anything with `generate(prompts, sampling)`, the
    RolloutEngine contract); `codec` renders and encodes observation turns."""

    def __init__(self, engine, codec: Codec, toolbox: Toolbox,
                 settings: TrajectorySettings = TrajectorySettings()):
        self.engine, self.codec = engine, codec
        self.toolbox, self.settings = toolbox, settings
        self.tokenizer = codec.tokenizer
        self.style: ObservationStyle = observation_style(codec.processor)
        # The most characters one token stands for (byte-level: a vocabulary entry's length is
        # its bytes): text longer than max_observation_tokens x this cannot fit, so it is
        # refused by its length before the tokenizer spends time and memory on it.
        self.token_chars = max(map(len, self.tokenizer.get_vocab()), default=1)

    @classmethod
    def from_config(cls, tc, engine, codec: Codec,
                    evaluation: bool = False, data=None) -> "TrajectoryRollout":
        """From a ToolsConfig (its tools, call format, budgets; eval_max_turns when
        `evaluation`) over any rollout engine; `data` (a DataConfig) gives the tools' results
        the records' media limits."""
        return cls(engine, codec, Toolbox.from_config(tc, data),
                   TrajectorySettings.from_config(tc, evaluation))

    def rollout(self, prompts: Sequence[PromptFeatures], sampling: SamplingParams,
                group_offset: int = 0) -> RolloutBatch:
        """G trajectories per prompt as a RolloutBatch (rows group-major, like single-turn
        ones): completion = model and observation turns, `loss_mask` 1 on model tokens,
        `sampler_logp` 0 on observations, `texts` the final turns, `trajectories` the rest."""
        g = sampling.num_generations
        contexts = [self.toolbox.context(p, self.codec) for p in prompts]
        rows = [_Row(prompt=p, context=c, offered=self.toolbox.offered(p.sample))
                for p, c in zip(prompts, contexts) for _ in range(g)]
        turn = 0
        while not all(r.done for r in rows):
            active = [r for r in rows if not r.done]
            self._turn(active, turn, sampling, first=turn == 0, prompts=prompts)
            self._observe([r for r in active if not r.done])
            turn += 1
        return self._batch(rows, group_offset, g)

    # ------------------------------------------------------------------------ turns ---------

    def _turn(self, rows: list[_Row], turn: int, sampling: SamplingParams, *, first: bool,
              prompts: Sequence[PromptFeatures]) -> None:
        s = self.settings
        left = [s.max_tokens - r.length for r in rows]
        limit = min(sampling.max_new_tokens, max(left))
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
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            row.record.turns += 1
            row.record.turn_texts.append(text)
            parsed = parse_turn(text, s.call_format)
            if cut:
                row.truncated = row.done = True
            elif parsed.final:
                row.done = True
            elif row.record.turns >= s.max_turns:
                row.record.hit_turn_cap = row.done = True
            else:
                row.pending = parsed.calls

    def _observe(self, rows: list[_Row]) -> None:
        """Run every pending call (all rows at once), then give each row its observation turn."""
        jobs = [(call, r.context, r.offered) for r in rows for call in r.pending]
        outcomes = iter(self.toolbox.run(jobs))
        for row in rows:
            answered = [(call, next(outcomes)) for call in row.pending]
            row.pending = []
            self._answer(row, answered)

    def _answer(self, row: _Row, answered: list[tuple[ToolCall, Outcome]]) -> None:
        s, turn = self.settings, row.record.turns - 1
        after = self.tokenizer.decode(row.ids[-1][-1:])
        chars = sum(len(x) for _, o in answered for x in o.items or () if isinstance(x, str))
        if chars > s.max_observation_tokens * self.token_chars:
            answered = _instead(answered, "too_long", f"the result is {chars} characters, more "
                                f"than {s.max_observation_tokens} tokens can hold; ask for less")
        try:
            ids, obs = self._encode(answered, after, row.length)
        except ValueError as e:  # the processor refused a result (a last line behind as_items)
            answered = _instead(answered, "bad_result", "the result could not be shown: "
                                f"{str(e).splitlines()[0][:200]}")
            ids, obs = self._encode(answered, after, row.length)
        if obs.length > s.max_observation_tokens:  # the results say so instead
            answered = _instead(answered, "too_long", f"the result is {obs.length} tokens, over "
                                f"the limit of {s.max_observation_tokens}; ask for less")
            ids, obs = self._encode(answered, after, row.length)
        row.record.calls += [o.record(c, turn) for c, o in answered]
        if row.length + obs.length + 1 > s.max_tokens:  # no room for a model token after it
            row.truncated = row.done = True  # the observation and its media are dropped whole
            return
        row.add(ids, None)
        row.record.observations.append(obs)

    def _encode(self, answered, after: str, start: int) -> tuple[torch.Tensor, Observation]:
        results, media = [], {"images": [], "videos": [], "audios": []}
        for _, outcome in answered:
            if outcome.error is not None:
                results.append([{"type": "text", "text": error_text(outcome.error,
                                                                     outcome.message)}])
                continue
            content, items = as_content(outcome.items)
            results.append(content)
            for kind, values in items.items():
                media[kind] += values
        return encode_observation(self.codec, results, media, after, start,
                                  self.style)

    # ------------------------------------------------------------------------ batch ---------

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


def _logp_dtype(rows) -> torch.dtype:
    """float32, or float64 when the engine sampled in float64 (tests that tell rounding apart)."""
    return torch.float64 if any(p.dtype == torch.float64 for r in rows for p in r.logp) \
        else torch.float32


def _instead(answered: list[tuple[ToolCall, Outcome]], kind: str, message: str):
    """Every answered call that succeeded becomes an error of `kind` (the turn's observation
    could not carry the results); calls that failed keep their own error."""
    return [(c, o if o.error else Outcome(error=kind, message=message, seconds=o.seconds))
            for c, o in answered]


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
