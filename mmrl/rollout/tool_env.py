"""The tools environment: a trajectory's model turns call the run's tools, and their results come
back as the next (observation) turn, rendered as tool responses.

One `ToolEnvironment` per trajectory holds its prompt's tool context (shared by the G
trajectories of a prompt) and the tools its record offers. The loop (mmrl/rollout/trajectory.py)
answers a turn of every trajectory at once through `ToolEnvironments.step`, so the calls of all
of them run concurrently through the one Toolbox of the run (its worker pool and threads,
mmrl/tools/toolbox.py). A turn at the turn cap runs no calls (the loop marks the cap).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from mmrl.envs.base import Step
from mmrl.models.codec import Codec
from mmrl.tools import Toolbox, ToolContext, as_content, error_text, parse_turn, tool_prompt
from mmrl.tools.calls import ToolCall
from mmrl.tools.toolbox import Outcome
from mmrl.types import Observation, PromptFeatures, Sample, Trajectory


class ToolEnvironment:
    """One trajectory's tools: its prompt's context and the tools its record offers."""

    def __init__(self, toolbox: Toolbox, context: ToolContext, offered: list[str],
                 call_format: str, max_turns: int):
        self.toolbox, self.context, self.offered = toolbox, context, offered
        self.call_format, self.max_turns = call_format, max_turns
        self.pending: list[ToolCall] = []

    def reset(self, sample: Sample) -> Sample:
        return sample  # the prompt is built once per run's prompt (ToolEnvironments.reset)

    def plan(self, trajectory: Trajectory, text: str) -> Step | None:
        """The Step when the turn runs no call (an answer, or the turn cap), else None with the
        turn's calls in `pending`."""
        parsed = parse_turn(text, self.call_format)
        if parsed.final:
            return Step(done=True)
        if trajectory.turns >= self.max_turns:  # still calling at the cap: not answered
            return Step(done=False)
        self.pending = parsed.calls
        return None

    def step(self, trajectory: Trajectory, text: str) -> Step:
        return ToolEnvironments.step_all([self], [trajectory], [text])[0]

    def close(self) -> None:
        pass


class ToolEnvironments:
    """The run's tools as an environment kind: prompts with the tool instructions, one
    ToolEnvironment per trajectory, every turn's calls answered at once. Built once per run
    (its Toolbox with it)."""

    trajectories = True  # rows are trajectories (tool metrics read their calls)

    def __init__(self, toolbox: Toolbox, codec: Codec, call_format: str = "qwen"):
        self.toolbox, self.codec = toolbox, codec
        self.call_format = call_format

    @classmethod
    def from_config(cls, tc, codec: Codec, data=None) -> "ToolEnvironments":
        return cls(Toolbox.from_config(tc, data), codec, tc.call_format)

    def reset(self, sample: Sample) -> Sample:
        """The sample with the tools it is offered: instructions in its system message, or the
        specs in `chat_tools` for a template that renders them (mmrl/tools/prompt.py)."""
        prompted, chat = tool_prompt(sample, self.toolbox, self.codec.processor,
                                     self.call_format)
        return dataclasses.replace(prompted, chat_tools=chat)

    def start(self, prompts: Sequence[PromptFeatures], g: int,
              max_turns: int) -> list[ToolEnvironment]:
        contexts = [self.toolbox.context(p, self.codec) for p in prompts]
        return [ToolEnvironment(self.toolbox, c, self.toolbox.offered(p.sample), self.call_format,
                                max_turns) for p, c in zip(prompts, contexts) for _ in range(g)]

    def step(self, envs: Sequence[ToolEnvironment], trajectories: Sequence[Trajectory],
             texts: Sequence[str]) -> list[Step]:
        return self.step_all(envs, trajectories, texts)

    @staticmethod
    def step_all(envs, trajectories, texts) -> list[Step]:
        """Every turn's calls in one Toolbox.run (concurrent, each within its timeout)."""
        steps = [e.plan(t, x) for e, t, x in zip(envs, trajectories, texts)]
        todo = [e for e, s in zip(envs, steps) if s is None]
        if not todo:
            return steps  # type: ignore[return-value]
        jobs = [(call, e.context, e.offered) for e in todo for call in e.pending]
        outcomes = iter(todo[0].toolbox.run(jobs))
        for i, (e, s) in enumerate(zip(envs, steps)):
            if s is None:
                steps[i] = Step(observation=[(c, next(outcomes)) for c in e.pending], role="tool")
                e.pending = []
        return steps  # type: ignore[return-value]

    def close(self, envs) -> None:
        pass


# ------------------------------------------------------------------ tool observation turns ----

def encode_tool_turn(loop, row, answered: list[tuple[ToolCall, Outcome]]) -> None:
    """A row's observation turn answering its calls (the loop's "tool" role): results over the
    character or token limit, or refused by the processor, become errors the model reads; an
    observation that leaves no room for a model token ends the row, dropped whole."""
    s, turn = loop.settings, row.record.turns - 1
    after = loop.tokenizer.decode(row.ids[-1][-1:])
    chars = sum(len(x) for _, o in answered for x in o.items or () if isinstance(x, str))
    if chars > s.max_observation_tokens * loop.codec.token_chars:
        answered = _instead(answered, "too_long", f"the result is {chars} characters, more "
                            f"than {s.max_observation_tokens} tokens can hold; ask for less")
    try:
        ids, obs = _encode(loop, answered, after, row.length)
    except ValueError as e:  # the processor refused a result (a last line behind as_items)
        answered = _instead(answered, "bad_result", "the result could not be shown: "
                            f"{str(e).splitlines()[0][:200]}")
        ids, obs = _encode(loop, answered, after, row.length)
    if obs.length > s.max_observation_tokens:  # the results say so instead
        answered = _instead(answered, "too_long", f"the result is {obs.length} tokens, over "
                            f"the limit of {s.max_observation_tokens}; ask for less")
        ids, obs = _encode(loop, answered, after, row.length)
    row.record.calls += [o.record(c, turn) for c, o in answered]
    loop.append_observation(row, ids, obs)


def _encode(loop, answered, after: str, start: int) -> tuple[torch.Tensor, Observation]:
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
    return loop.encode(results, media, after, start, loop.style)


def _instead(answered: list[tuple[ToolCall, Outcome]], kind: str, message: str):
    """Every answered call that succeeded becomes an error of `kind` (the turn's observation
    could not carry the results); calls that failed keep their own error."""
    return [(c, o if o.error else Outcome(error=kind, message=message, seconds=o.seconds))
            for c, o in answered]
