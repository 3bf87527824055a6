"""The GRPO-family training step, as stages over the trainer's parts:

    prompts  -> rollout (G completions each) -> scores -> [dynamic sampling] -> advantages
             -> old/ref logprobs -> update (micro-batches, accumulate, clip, step) -> sync -> metrics

The parts, built in this order by `Trainer.__init__` (setup), each in its own file:

    Policy        train/policy.py        the model (+LoRA): build, forwards, logprobs, KL reference
    Learner       train/learner.py       strategy, optimizer, schedule, update, non-finite guard
    Rollout       train/generation.py    the rollout engine and the sampling settings
    Scorer        train/scoring.py       rewards, advantages over the global batch
    PromptSource  train/prompts.py       sampler, media loader, feature cache, bad-sample policy
    Checkpointer  train/checkpointer.py  save / restore every part's state

run.py drives a Trainer (warm-up, evaluation, the step loop, summary) and hands the Policy to
the warm-up and evaluation; only this file and the Checkpointer hold the Learner. Each part names
what other files may read of it (`PUBLIC`; tests/train/test_structure.py). The methods from the
papers (train/methods.py) hook in where noted: prompt features and history in the PromptSource,
group ids in the Scorer, temporal contrast and ground-truth guidance at the end of the rollout
stage, the guided reshaping and history weights in the advantage stage, their metrics in the
metrics stage.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import asdict

import torch

from mmrl import algos
from mmrl.config import RunConfig, save as save_config
from mmrl.data.inspect import answer_budget_warning
from mmrl.data.prepare import build_datasets, check_datasets
from mmrl.models import get_adapter
from mmrl.rollout.environments import make_environments
from mmrl.train import checkpoint, dist, methods, parallel, setup, sp, speed
from mmrl.train.async_rollout import IN_FLIGHT, AsyncRollout
from mmrl.train.checkpointer import Checkpointer
from mmrl.train.generation import Rollout
from mmrl.train.learner import Learner
from mmrl.train.logging import RunLogger
from mmrl.train.policy import Policy
from mmrl.train.prompts import PromptSource
from mmrl.train.resume_config import as_plain
from mmrl.train.rollout_utils import concat_rollouts
from mmrl.train.scoring import Scorer, rewards_at
from mmrl.train.step_metrics import StageTimer, StepMetrics
from mmrl.types import RolloutBatch, ScoredBatch


FROM_CONFIG = object()  # Trainer(resume=...): resolve train.resume here


class Trainer:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("cfg", "run_dir", "info", "layout", "policy", "envs", "prompts", "scorer",
              "rollout", "log", "eval_set", "step", "state_extra", "train_step", "sample_batch", "learn",
              "check_finite", "sync_engine", "save", "rewind", "stop", "memory", "close",
              "phases")

    def __init__(self, cfg: RunConfig, logger: RunLogger | None = None, resume=FROM_CONFIG):
        """Setup: every part built explicitly, in an order that keeps the RNG streams (and so a
        resumed run) exactly as they were. `resume`: the checkpoint rank 0 chose and verified
        (rundir.prepare), else train.resume is resolved here."""
        self.cfg, self.run_dir = cfg, cfg.run_dir
        setup.check_environment(cfg)
        self.info = dist.init()  # every process: gradients, files, checkpoints
        # The rows' view (sample slice, advantages, normaliser, metric means): the data-parallel
        # ranks, each a sequence group of train.sequence_parallel processes (train/sp.py).
        self.layout = sp.make_layout(self.info, cfg.train.sequence_parallel)
        data = self.layout.data
        strategy = parallel.make(cfg, self.info)
        setup.set_seed(cfg.train.seed)
        adapter = get_adapter(cfg.model.family)
        train_set, self.eval_set = build_datasets(cfg, adapter.image_factor)
        with rewards_at("at start, asking each reward which records it can score"):
            data_warnings = check_datasets(cfg, train_set, self.eval_set,
                                           adapter.media_kinds)
        if resume is FROM_CONFIG:
            resume = (checkpoint.resolve_resume(cfg.train.resume, self.run_dir)
                      if self.info.main else None)
        resume = dist.broadcast_object(resume, self.info)  # every rank resumes what rank 0 chose
        self.policy = Policy(cfg, self.info, strategy, adapter,
                             resume if checkpoint.has_weights(resume) else None,
                             sequence=self.layout.sequence)
        self.learner = Learner(cfg, self.info, strategy, self.policy, data=data)
        # The run's environment kind, built once (with tools: the one Toolbox of the run).
        self.envs = make_environments(cfg, self.policy.codec)
        self.rollout = Rollout(cfg, self.policy, self.envs)
        self.policy.choose_layout(cfg.train.shared_prefix)
        self.scorer = Scorer(cfg, data)
        self.timer, self.phases = StageTimer(), speed.PhaseTotals()  # where the seconds go
        self.prompts = PromptSource(cfg, train_set, self.policy.codec, data, self.envs)
        main = self.info.main  # only rank 0 writes the run dir; other ranks keep a local log
        self.log = logger or RunLogger(
            self.run_dir if main else self.run_dir / f"rank{self.info.rank}",
            tensorboard=cfg.log.tensorboard and main, wandb=cfg.log.wandb and main,
            progress=cfg.log.progress if main else "silent", log_every=cfg.log.log_every,
            config=asdict(cfg))
        if main and not (self.run_dir / "config.yaml").is_file():  # a resume keeps the original
            save_config(cfg, self.run_dir / "config.yaml")
            cut = answer_budget_warning(cfg, train_set, self.policy.codec.tokenizer)
            for warning in ([cut] if cut else []) + data_warnings:
                self.log.warn(warning)
        self.prompts.say = self.log.warn  # skipped records: on the terminal and in warnings.txt
        self.report = StepMetrics(cfg, self.layout, self.policy, self.rollout, self.scorer,
                                  self.prompts, self.log, self.phases)  # the metrics stage
        self.checkpointer = Checkpointer(self.run_dir, cfg.train, self.info, self.log)
        # Saved with the rest: run.py's stage results (SFT, accuracy before RL) and the
        # algorithms' carried values (the adaptive KL-in-reward coefficient).
        self.step, self.state_extra = 0, {}
        self.stop, self._step_start = None, None  # set by run.py (signals.StopSignals)
        self.memory = None  # run.py's memory.PhasePeaks: measured peak memory per stage
        if resume is not None:
            self.step, self.state_extra = self.checkpointer.restore(resume, self.learner,
                                                                    self.prompts)
        # rollout.max_staleness >= 1: a sampler process runs ahead on its own weights (None: the
        # synchronous loop, untouched); a resumed run draws its in-flight prompts again first.
        self.sampler = (AsyncRollout(cfg, self.policy, self.prompts)
                        if cfg.rollout.max_staleness > 0 else None)
        if self.sampler is not None:
            self.log.print(self.sampler.describe())
            self.sampler.load_state_dict(self.state_extra.pop(IN_FLIGHT, {}), self.step)

    # ---------------------------------------------------------------- one step -----------------
    def train_step(self) -> dict[str, float]:
        timer = self.timer = StageTimer(self.memory)
        stop = self.stop  # run.py's StopSignals: a signal may abandon the rollout (signals.py)
        self._step_start = self._resumable_state() if stop is not None else None
        if self.sampler is not None:
            self.sampler.mark()
        with timer("rollout"), rewards_at(f"step {self.step + 1}"), \
                stop.abandonable() if stop is not None else nullcontext():
            batch, scores, per_reward, extra = self.sample_batch()
            scores, tgrpo = methods.temporal_contrast(self.cfg, self.step, self.policy,
                                                      self.rollout, self.scorer, batch, scores,
                                                      per_reward)
            batch, scores, per_reward, guided, gt = methods.inject_ground_truth(
                self.cfg.algo, self.policy, self.scorer, batch, scores, per_reward)
        extra.update({**gt, **tgrpo})
        return self.learn(batch, scores, per_reward, extra, timer, guided)

    def sample_batch(self) -> tuple[RolloutBatch, torch.Tensor, dict[str, list], dict]:
        """Prompts -> rollout -> scores; with dynamic sampling, keep only groups with reward
        signal and sample more prompts until the batch is full (DAPO)."""
        ac, b, ranks = self.cfg.algo, self.cfg.rollout.prompts_per_step, self.layout.data.world
        base = self.prompts.group_base(b)
        if not ac.dynamic_sampling:
            if self.sampler is not None:  # async: drawn ahead, at most k versions old
                batch, extra = self.sampler.take(self.step)
            else:
                batch, extra = self.rollout.generate(self.prompts.next(b), group_offset=base), {}
            with self.timer.part("scoring", of="rollout"):
                scores, per = self.scorer.score(batch)
            self.prompts.observe(batch, scores)
            return batch, scores, per, {"sampling/rounds": 1, **extra}
        acc = algos.GroupAccumulator(target_groups=b // ranks,
                                     max_rounds=ac.max_sampling_rounds)
        pieces, offset = [], 0
        while not acc.full:
            batch = self.rollout.generate(self.prompts.next(b), group_offset=base + offset)
            offset += b * ranks
            with self.timer.part("scoring", of="rollout"):
                scores, per = self.scorer.score(batch)
            self.prompts.observe(batch, scores)
            ids, keep = algos.groups_with_signal(scores, batch.group_ids)
            acc.add(ids.tolist(), keep)  # raises with advice after max_rounds
            rows = torch.isin(batch.group_ids, ids[keep]).nonzero().flatten().tolist()
            pieces.append((batch.select(rows), scores[rows],
                           {k: [v[i] for i in rows] for k, v in per.items()}))
        batch, scores, per = concat_rollouts(pieces, self.policy.codec.pad_id)
        rows = torch.isin(batch.group_ids, torch.tensor(acc.take())).nonzero().flatten().tolist()
        return (batch.select(rows), scores[rows], {k: [v[i] for i in rows] for k, v in per.items()},
                {"sampling/rounds": acc.round})

    def learn(self, batch: RolloutBatch, scores: torch.Tensor, per_reward: dict[str, list],
              extra: dict | None = None, timer: "StageTimer | None" = None,
              guided: torch.Tensor | None = None) -> dict[str, float]:
        """Everything after sampling: advantages, old/ref logprobs, update, sync, metrics.
        `guided` flags the ground-truth rows (methods.inject_ground_truth)."""
        ac, timer, extra, policy = (self.cfg.algo, timer or StageTimer(self.memory), extra or {},
                                     self.policy)
        sb = ScoredBatch(rollout=batch, scores=scores, per_reward=per_reward, advantages=scores)
        with timer("logprob"):
            sb.old_logp, sb.ref_logp = policy.step_logprobs(batch)  # frozen encoders: once
        with timer("advantage"):
            rewards = (self.scorer.kl_in_reward(sb, self.state_extra, extra)
                       if ac.kl_reward_coef > 0 else scores)
            rewards = methods.guided_scores(ac, guided, rewards, batch.group_ids)
            sb.advantages = self.scorer.advantages(rewards, batch.group_ids,
                                                   batch.policy_mask.sum(1))
            sb.advantages = self.prompts.weight_advantages(sb.advantages, batch)
        with timer("update"):
            metrics = self.learner.update(sb, self.step)
        policy.fix_reference(self.step + 1)  # ProRL's refresh (algo.ref_reset_every)
        with timer("sync"):
            if self.sampler is None:
                self.rollout.sync()
            else:  # the sampler loads (or pushes) them before its next batch, not the trainer
                self.sampler.publish(self.step + 1)
        self.step += 1
        return self.report(sb, metrics, extra, timer, self.step, self.learner.metrics())

    # ---------------------------------------------------------------- around the steps ---------
    def sync_engine(self) -> None:
        """After weights change outside a step (SFT warm-up)."""
        self.rollout.sync()

    def check_finite(self) -> None:
        """Stop after too many non-finite steps in a row (the Learner's guard)."""
        self.learner.check_finite(self.step)

    def _resumable_state(self) -> tuple:
        """What a step changes before its update: the prompts' position and history, the random
        streams, the carried algorithm state (the weights change only in the update)."""
        return (copy.deepcopy(self.prompts.state_dict()), checkpoint.rng_state(),
                copy.deepcopy(self.state_extra))

    def rewind(self) -> None:
        """Back to the start of the step being abandoned, so that a save now equals the save at
        the end of the previous step, and a resumed run redoes the step as it would have run."""
        prompts, rng, self.state_extra = self._step_start
        self.prompts.load_state_dict(prompts)
        checkpoint.set_rng_state(rng)
        if self.sampler is not None:
            self.sampler.rewind()

    def save(self) -> None:
        self.state_extra["config"] = as_plain(self.cfg)  # what a resume compares its config with
        if self.sampler is not None:  # the prompts submitted and not trained yet
            self.state_extra[IN_FLIGHT] = self.sampler.state_dict()
        self.checkpointer.save(self.step, self.learner, self.prompts, self.state_extra)

    def close(self) -> None:
        try:
            if self.sampler is not None:
                self.sampler.close()
            self.rollout.close()
        finally:  # the logger gives transformers' progress bars back even then
            self.log.close()

