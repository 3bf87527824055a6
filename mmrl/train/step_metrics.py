"""The metrics stage of a step, and the clock every stage runs under.

    timer = StageTimer(memory)          with timer("rollout"): ...   -> time/rollout, time/step
    report = StepMetrics(cfg, layout, parts...)
    report(sb, metrics, extra, timer, step, learner.metrics()) -> the step's metrics

StepMetrics gathers one step's numbers from the parts that made them (the rollouts' rewards and
lengths, the methods' metrics, trajectories, the rewards' own, times and speeds, each part's
`metrics()`), lets the watchers judge them, averages them over the data-parallel ranks and logs
the rollouts due. The loop passes the Learner's numbers in: only loop.py holds the Learner.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

from mmrl.config import RunConfig
from mmrl.tools import trajectory_metrics
from mmrl.train import dist, methods, speed
from mmrl.train.generation import Rollout
from mmrl.train.logging import RunLogger
from mmrl.train.policy import Policy
from mmrl.train.prompts import PromptSource
from mmrl.train.rollout_utils import rollout_metrics, rollout_records
from mmrl.train.scoring import Scorer
from mmrl.train.watch import Watchers
from mmrl.types import ScoredBatch


class StageTimer:
    def __init__(self, memory=None):
        self.times: dict[str, float] = {}
        self.memory = memory  # memory.PhasePeaks: each stage's peak memory too

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        with self.memory(name) if self.memory is not None else nullcontext():
            yield
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t

    @contextmanager
    def part(self, name: str, of: str):
        """Time `name` inside stage `of` (running) and take its seconds out of `of`, so the
        stages still sum to the step (scoring runs inside the rollout stage)."""
        t = time.perf_counter()
        yield
        spent = time.perf_counter() - t
        self.times[name] = self.times.get(name, 0.0) + spent
        self.times[of] = self.times.get(of, 0.0) - spent

    @property
    def total(self) -> float:
        return sum(self.times.values())

    def metrics(self) -> dict[str, float]:
        memory = self.memory.metrics() if self.memory is not None else {}
        return {**{f"time/{k}": v for k, v in self.times.items()}, "time/step": self.total,
                **memory}


class StepMetrics:
    def __init__(self, cfg: RunConfig, layout, policy: Policy, rollout: Rollout, scorer: Scorer,
                 prompts: PromptSource, log: RunLogger, phases: speed.PhaseTotals):
        self.cfg, self.layout, self.policy, self.rollout = cfg, layout, policy, rollout
        self.scorer, self.prompts, self.log, self.phases = scorer, prompts, log, phases
        self.watchers = Watchers(cfg.rollout.max_new_tokens, cfg.algo)

    def __call__(self, sb: ScoredBatch, metrics: dict, extra: dict, timer: StageTimer, step: int,
                 learner: dict[str, float]) -> dict[str, float]:
        """`metrics`: the update's, `extra`: the sampling's and the methods'; `learner`: the
        Learner's metrics()."""
        cfg, batch = self.cfg, sb.rollout
        metrics.update(extra)
        metrics.update(self.prompts.end_step())  # prompt history: commit, kept fraction
        metrics.update(methods.label_free_metrics(cfg, batch))
        metrics.update(methods.think_metrics(cfg, batch))
        metrics.update(rollout_metrics(sb, self.scorer.keys))
        if batch.trajectories is not None:  # turns, turn-cap share; with tools calls, errors
            metrics.update(trajectory_metrics(batch.trajectories, cfg.tools.enabled))
        metrics.update(self.scorer.step_metrics())
        self.watchers(metrics, self.log.warn)
        metrics.update(timer.metrics())
        tokens = int(batch.completion_mask.sum()) + sum(p.input_ids.numel() for p in batch.prompts)
        metrics["time/tokens_per_s"] = tokens / max(timer.total, 1e-9)
        metrics.update(self.rollout.metrics(int(batch.policy_mask.sum())))  # prefill, decode
        metrics.update(speed.update_mfu(self.policy.model, batch, timer.times.get("update", 0.0),
                                        cfg.train.shared_prefix))
        metrics.update(learner)
        metrics.update(self.policy.metrics())
        metrics.update(self.prompts.metrics())
        data = self.layout.data  # a sequence group's ranks hold the same rows: counted once
        metrics = dist.mean_metrics(metrics, data)
        if data.enabled:  # each data-parallel rank's loss is its part of the global sum
            metrics["loss/loss"] *= data.world
        self.phases.observe(metrics)
        if cfg.log.rollouts_every and step % cfg.log.rollouts_every == 0:
            media = self.log.run_dir / "rollout_media" / f"step_{step:06d}"  # environments'
            self.log.log_rollouts(step, rollout_records(sb, cfg.log.rollouts_per_step, media))
        return metrics
