"""The environment contract: what a trajectory talks to between its model turns.

One instance per trajectory (it may hold state: a map, a cursor, a game), built by the run from
`env.name` and `env.args`. The loop (mmrl/rollout/trajectory.py) calls

    reset(sample)             once, before the first model turn: the first user turn as a Sample
                              (its prompt and media). It must be a function of the sample alone:
                              the G trajectories of a group answer one prompt (GRPO compares them),
                              and the prompt is processed once and cached. Randomness belongs in
                              the record (a seed field), never in reset.
    step(trajectory, text)    after each model turn (`text`: that turn, decoded; `trajectory`:
                              the turns so far): a Step -- the next observation, whether the
                              trajectory is done, and `info` for the rewards.
    close()                   when the trajectory ends (also after an error or a timeout).

Many instances run at once (one per trajectory of a step), each on one thread at a time; `step`
is stopped at `env.timeout_s` by the rules tools follow (the trajectory ends, the timeout is
counted). Single-turn is the environment that is done after the first model turn; tools are the
environment whose observations are tool results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from mmrl.registry import Registry
from mmrl.types import Sample, Trajectory

# Built-in environments by name; "pkg.mod:Class" imports a user environment (the loader).
ENVIRONMENTS: Registry[Callable[..., "Environment"]] = Registry("environment")


@dataclass
class Step:
    """An environment's answer to one model turn.

    `observation`: the next user turn's items in order -- str, PIL.Image, mmrl.types.Video
    (frames + fps) or a 1-D float waveform at 16 kHz, as a tool returns them (tools/base.py
    as_items checks them against the records' media guards). Ignored when `done`.
    `info`: merged into the trajectory's info, which the rewards receive (`info=` keyword).
    `role`: "user" (a user turn of the items above: every user environment) or "tool" (the tools
    environment's: `observation` holds its answered calls, rendered as tool responses).
    """

    observation: list[Any] = field(default_factory=list)
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    role: str = "user"


class Environment:
    """The base class (optional: any object with these three methods is an environment). It is
    the single-turn environment: the record's own prompt, done after the first model turn."""

    def reset(self, sample: Sample) -> Sample:
        return sample

    def step(self, trajectory: Trajectory, text: str) -> Step:
        return Step(done=True)

    def close(self) -> None:
        pass


ENVIRONMENTS.add("single_turn", Environment)
