"""The learner: what changes the policy's weights.

It owns the parallel strategy's training setup (the module training forwards go through, handed
to the Policy), the optimizer and LR schedule, and the policy update: micro-batches accumulated
into one optimizer step per iteration, with a global loss normaliser, and the non-finite guard
(a NaN/inf loss or gradient norm skips the step and is counted; too many in a row stop the run).
The model itself, its forwards and the KL reference are the Policy's (train/policy.py).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mmrl import algos
from mmrl.config import RunConfig
from mmrl.train import dist
from mmrl.types import ScoredBatch

if TYPE_CHECKING:
    from mmrl.train.parallel import Strategy
    from mmrl.train.policy import Policy


class Learner:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("policy", "strategy", "optimizer", "lr", "update", "metrics", "check_finite",
              "nonfinite_streak", "state_dict", "load_state_dict")

    def __init__(self, cfg: RunConfig, info: dist.DistInfo, strategy: Strategy, policy: Policy,
                 data: dist.DistInfo | None = None):
        """`data`: the data-parallel view (train/sp.py; `info` itself without sequence
        parallelism): the ranks of a sequence group hold the same rows, counted once in the
        loss normaliser, while gradients are reduced over every process (`info`)."""
        self.info, self.strategy, self.policy = info, strategy, policy
        self.data = data or info
        self.algo, self.seed, self.train_cfg = cfg.algo, cfg.train.seed, cfg.train
        self.loss = loss_settings(cfg)
        self.mask_turn_cap = cfg.tools.enabled and cfg.tools.mask_truncated_trajectories
        self.decoupled = cfg.rollout.max_staleness > 0  # samples from older weights (async)
        self.max_nonfinite = max(1, cfg.train.max_nonfinite_steps)
        module, self.optimizer, self.scheduler = strategy.setup(policy.model, cfg.train.steps)
        policy.attach(module)
        self.nonfinite_skipped = self.nonfinite_streak = 0  # steps skipped for NaN/inf

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # ---------------------------------------------------------------- update -------------------
    def update(self, sb: ScoredBatch, step: int) -> dict[str, float]:
        """One optimizer step per iteration over `sb`; `step` (steps done) seeds the random
        token selection of clip_cov / kl_cov, so a resumed run draws the same tokens."""
        ac, batch, policy = self.algo, sb.rollout, self.policy
        mask = batch.policy_mask.float()  # tool-use rows: the model's tokens, no observations
        if ac.overlong_filter:
            mask = algos.overlong_filter_mask(mask, batch.truncated)
        if self.mask_turn_cap:  # Mini-o3: rows still calling tools at max_turns leave the loss
            mask = algos.overlong_filter_mask(mask, batch.hit_turn_cap)
        # The normaliser is global so that summing micro-batch losses equals the one-shot loss.
        local = algos.loss_normalizer(mask, ac.agg)
        normalizer = float(dist.all_sum(local, self.data).clamp(min=1))
        sums: dict[str, float] = {}
        policy.model.train()
        chunks = policy.micro_batches(batch)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + step)  # clip_cov
        gap = 0.0  # the rollout engine's logprobs against the trainer's, same weights
        stepped = True
        for it in range(ac.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            it_loss = 0.0
            for i, rows in enumerate(chunks):
                # An empty micro-batch (policy.micro_batches) runs row 0: weight 0, no metrics.
                real, rows = bool(rows), rows or [0]
                (logp, ent), width = policy.forward(batch, rows, entropy=True)
                m = mask[rows, :width].to(logp.device) * real
                old = logp.detach() if sb.old_logp is None else sb.old_logp[rows, :width]
                if it == 0 and batch.sampler_logp is not None:
                    gap = max(gap, _max_gap(old, batch.sampler_logp[rows, :width], m))
                weights = None
                # Rollout-engine mismatch (algo.tis_cap), or, with rollout.max_staleness >= 1,
                # always: the decoupled objective's behaviour weight (mmrl/algos/decoupled.py).
                if (ac.tis_cap or self.decoupled) and batch.sampler_logp is not None:
                    weights = algos.behaviour_weights(
                        old.to(logp.device), batch.sampler_logp[rows, :width].to(logp.device), m,
                        ac.tis_cap, level=ac.tis_level, mode=ac.tis_mode)
                ref = None if sb.ref_logp is None else sb.ref_logp[rows, :width].to(logp.device)
                loss, metrics = algos.policy_loss(
                    algos.LossInputs(logp, old.to(logp.device), sb.advantages[rows].to(logp.device),
                                     m, ref_logp=ref, entropy=ent, token_weights=weights),
                    self.loss, normalizer=normalizer, generator=generator)
                self.strategy.backward(loss, last=i == len(chunks) - 1)
                it_loss += float(loss.detach())
                if not real:
                    continue
                frac = len(rows) / batch.n  # metrics are micro-batch means: weight by rows
                metrics = {**metrics, "loss": loss.detach() / frac,
                           "entropy": (ent * m).sum() / m.sum().clamp(min=1)}
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v) * frac / ac.num_iterations
            stepped = self._step(sums, it_loss) and stepped
        if stepped:
            self.scheduler.step()
        self.nonfinite_streak = 0 if stepped else self.nonfinite_streak + 1
        self.nonfinite_skipped += not stepped
        out = {f"loss/{k}" if k not in ("grad_norm", "entropy") else k: v for k, v in sums.items()}
        out["train/nonfinite_skipped"] = self.nonfinite_skipped
        if batch.sampler_logp is not None:  # ~1e-6 in float32; bf16 engines drift more (tis_cap)
            out["rollout/logp_gap_max"] = gap
        return out

    def _step(self, sums: dict, loss: float) -> bool:
        """The optimizer step of one iteration -> whether it happened. A NaN/inf loss never
        reaches the optimizer (nor does a NaN/inf grad norm: the strategy's step skips it): the
        step is skipped and counted."""
        if dist.all_sum(float(not math.isfinite(loss)), self.info) > 0:
            self.optimizer.zero_grad(set_to_none=True)
            sums["grad_norm"] = float("nan")
            return False
        sums["grad_norm"] = self.strategy.step(self.policy.model, self.optimizer)
        return math.isfinite(sums["grad_norm"])

    def check_finite(self, step: int) -> None:
        """Stop the run after train.max_nonfinite_steps skipped steps in a row (called once the
        step's metrics are logged, so the log shows them)."""
        streak = self.nonfinite_streak
        if streak >= self.max_nonfinite:
            raise FloatingPointError(
                f"step {step}: loss or gradient norm was NaN/inf in {streak} "
                f"steps in a row (each skipped, the weights untouched); lower train.lr, set "
                f"train.max_grad_norm (e.g. 1.0), use model.dtype=float32 or bfloat16 instead of "
                f"float16, or check the rewards' scale. Resume from the last checkpoint with "
                f"train.resume=auto")

    def metrics(self) -> dict[str, float]:
        return {"lr": self.lr}

    # ---------------------------------------------------------------- state --------------------
    def state_dict(self) -> dict:
        """The learner's part of a checkpoint's trainer state; sharded strategies write their
        optimizer state as shards (`strategy.save_shards`) instead."""
        state = {"scheduler": self.scheduler.state_dict(),
                 "parallel": {"name": self.strategy.name, "world": self.info.world}}
        if not self.strategy.sharded_checkpoint:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict, ckpt: Path) -> None:
        saved = state.get("parallel", {"name": "ddp", "world": 1})
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        elif (saved["name"], saved["world"]) != (self.strategy.name, self.info.world):
            raise RuntimeError(
                f"{ckpt} holds {saved['name']} shards from {saved['world']} processes; resume it "
                f"with the same launcher and process count, or turn it into a model with "
                f"`mmrl checkpoint consolidate {ckpt}` and start a new run from that (model.path)")
        else:
            self.strategy.load_shards(ckpt, self.policy.model, self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optimizer_settings(self.optimizer, self.scheduler, self.train_cfg)


def apply_optimizer_settings(optimizer, scheduler, tc) -> None:
    """After a resume: the config's lr, betas and weight decay, not the checkpoint's. A restored
    optimizer and LambdaLR carry their old base lr (a resume with train.lr=5e-4 kept training at
    1e-4); the schedule's shape (steps, warm-up, kind) is the new config's already."""
    for group in optimizer.param_groups:
        group["betas"], group["weight_decay"] = tuple(tc.betas), tc.weight_decay
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None or list(scheduler.base_lrs) == [tc.lr] * len(scheduler.base_lrs):
        return
    scheduler.base_lrs = [tc.lr] * len(optimizer.param_groups)
    for group, factor in zip(optimizer.param_groups, lambdas):
        group["initial_lr"] = tc.lr
        group["lr"] = tc.lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def loss_settings(cfg: RunConfig) -> algos.LossSettings:
    """The run's loss settings: algo.* under the same names, and the generation budget."""
    names = [f.name for f in dataclasses.fields(algos.LossSettings) if f.name != "max_len"]
    return algos.LossSettings(max_len=cfg.rollout.max_new_tokens,
                              **{n: getattr(cfg.algo, n) for n in names})


def _max_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> float:
    diff = (trainer_logp.float().cpu() - sampler_logp.float().cpu()).abs()[mask.cpu().bool()]
    return float(diff.max()) if diff.numel() else 0.0
