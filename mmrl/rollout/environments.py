"""Environments as the trajectory loop runs them: one instance per trajectory, every turn's
`step` calls at once, each within a time limit; and the one function that builds a prompt
(`prompt_features`: the environment's reset, then the processor call) for training, the SFT
warm-up and evaluation.

An environment kind is built once per run (`make_environments`): `Environments` for any
Environment class (single_turn, a registered name, a user "pkg.mod:Class"), `ToolEnvironments`
(mmrl/rollout/tool_env.py) for the tools. Both answer `reset(sample)` (the first user turn),
`start(prompts, g, max_turns)` (the instances), `step(envs, trajectories, texts)` (a Step each)
and `close(envs)`, and say by `trajectories` whether rows come back as trajectories.

A user environment's `step` runs on a daemon thread, at most `workers` at a time; one past
`timeout_s` ends its trajectory (Step.info {"env_timeout": true}). Python cannot kill a thread: the
late step runs on in the background, its result dropped, and the instance is closed when it
returns. (User tools run in worker processes instead, killed at their limit, because a tool is a
stateless function; an environment holds state that lives in the trainer's process.)
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from mmrl.data.media import processor_errors
from mmrl.envs.base import ENVIRONMENTS, Environment, Step
from mmrl.tools.workers import WAKE_S
from mmrl.types import PromptFeatures, Sample, Trajectory


class Environments:
    """Instances of one Environment class (`make`: the class, args bound), stepped on threads
    with a deadline (`timeout_s`; None: inline, for the built-in single_turn)."""

    def __init__(self, make: Callable[[], Environment], *, name: str = "single_turn",
                 timeout_s: float | None = 30.0, workers: int = 8, trajectories: bool = True):
        self.make, self.name, self.timeout_s = make, name, timeout_s
        self.workers, self.trajectories = max(1, int(workers)), trajectories
        self._prompt_env: Environment | None = None  # resets samples into prompts
        self._late: set[int] = set()  # id() of instances whose step ran past the timeout

    def reset(self, sample: Sample) -> Sample:
        if self._prompt_env is None:
            self._prompt_env = self.make()
        return self._prompt_env.reset(sample)

    def start(self, prompts: Sequence[PromptFeatures], g: int, max_turns: int) -> list:
        envs = []
        for p in prompts:
            for _ in range(g):
                env = self.make()
                env.reset(p.record or p.sample)
                envs.append(env)
        return envs

    def step(self, envs: Sequence, trajectories: Sequence[Trajectory],
             texts: Sequence[str]) -> list[Step]:
        if self.timeout_s is None:
            return [_checked(self.name, e.step(t, x)) for e, t, x in zip(envs, trajectories, texts)]
        out: list[Step] = []
        jobs = list(zip(envs, trajectories, texts))
        for start in range(0, len(jobs), self.workers):
            out += self._wave(jobs[start:start + self.workers])
        return out

    def _wave(self, jobs) -> list[Step]:
        slots = [_Slot(env) for env, _, _ in jobs]
        for slot, (env, trajectory, text) in zip(slots, jobs):
            slot.thread = threading.Thread(target=slot.run, args=(trajectory, text), daemon=True,
                                           name=f"mmrl-env-{self.name}")
            slot.thread.start()
        deadline = time.monotonic() + self.timeout_s
        steps = []
        for slot in slots:
            while slot.thread.is_alive() and time.monotonic() < deadline:  # wakes for signals
                slot.thread.join(min(WAKE_S, max(0.0, deadline - time.monotonic())))
            if slot.abandon():
                self._late.add(id(slot.env))
                steps.append(Step(done=True, info={"env_timeout": True}))
            else:
                steps.append(slot.result(self.name))
        return steps

    def close(self, envs: Sequence) -> None:
        for env in envs:
            if id(env) in self._late:  # its own thread closes it when the step returns
                self._late.discard(id(env))
            else:
                env.close()


class _Slot:
    """One step call on its own thread; a late one closes its environment when it returns."""

    def __init__(self, env):
        self.env, self.step, self.error, self.lock = env, None, None, threading.Lock()
        self.thread: threading.Thread | None = None
        self.late = self.done = False

    def run(self, trajectory, text) -> None:
        try:
            step = self.env.step(trajectory, text)
        except BaseException as e:  # noqa: BLE001 -- raised again on the loop's thread
            step, self.error = None, e
        with self.lock:
            self.step, self.done, late = step, True, self.late
        if late:
            self.env.close()

    def abandon(self) -> bool:
        """True when the step is still running: it is left to finish (and close) on its own."""
        with self.lock:
            self.late = not self.done
            return self.late

    def result(self, name: str) -> Step:
        if self.error is not None:
            raise RuntimeError(f"env {name}: step raised {type(self.error).__name__}: "
                               f"{self.error}") from self.error
        return _checked(name, self.step)


def _checked(name: str, step) -> Step:
    if not isinstance(step, Step):
        raise TypeError(f"env {name}: step returned {type(step).__name__}, not "
                        f"mmrl.envs.Step(observation, done, info)")
    return step


def make_environments(cfg, codec, toolbox=None):
    """The run's environment kind from `env:` (and `tools:` for the tools): built once per run.
    `toolbox`: the tools' Toolbox when the caller has one (else built here)."""
    name = cfg.env_name
    if cfg.tools.enabled:
        from mmrl.rollout.tool_env import ToolEnvironments
        from mmrl.tools import Toolbox

        box = toolbox if toolbox is not None else Toolbox.from_config(cfg.tools, cfg.data)
        return ToolEnvironments(box, codec, cfg.tools.call_format)
    try:
        cls = ENVIRONMENTS.get(name)
    except KeyError as e:
        raise ValueError(f"env.name: {e.args[0]}; registered: "
                         f"{', '.join(ENVIRONMENTS.names())}, or \"pkg.mod:Class\"") from None
    args = dict(cfg.env.args)
    make = (lambda: cls(**args)) if args else cls
    builtin = name in ENVIRONMENTS
    return Environments(make, name=name, timeout_s=None if builtin else cfg.env.timeout_s,
                        workers=cfg.env.workers, trajectories=cfg.multi_turn)


def prompt_features(envs, codec, sample: Sample, load) -> PromptFeatures:
    """The one prompt of `sample`: the environment's first user turn (reset; `envs` None: the
    sample as it is), its media decoded by `load` (a media loader: reset may name other media
    files than the record's), processed once, the decoded media kept (engines and tool contexts
    read them)."""
    prompted = sample if envs is None else envs.reset(sample)
    media = load(prompted)
    with processor_errors(prompted):  # e.g. aspect ratio: a media error naming the record
        feats = codec.prompt_features(prompted, tools=prompted.chat_tools, **media)
    feats.media = media
    if prompted is not sample:
        feats.record = sample
    return feats
