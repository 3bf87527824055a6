"""The learner: the policy being trained and everything that changes its weights.

It owns the model (and its LoRA wrapper), the parallel strategy that places and shards it, the
optimizer and LR schedule, the optional KL reference, and the two things a step asks of them:
per-token logprobs of completions, and the policy update (micro-batches accumulated into one
optimizer step per iteration). It asks the strategy what it does (`places_model`,
`every_module`, `sharded_checkpoint`) rather than which one it is.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from mmrl import algos
from mmrl.config import RunConfig
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import enable_shared_prefix, shared_prefix_logprobs
from mmrl.models.towers import TowerToucher
from mmrl.train import dist, lora, setup
from mmrl.types import RolloutBatch, ScoredBatch


class Learner:
    def __init__(self, cfg: RunConfig, info: dist.DistInfo, strategy, adapter, weights=None):
        """`weights`: a checkpoint to load the model from (resume), else model.path."""
        self.info, self.strategy, self.adapter = info, strategy, adapter
        self.algo, self.micro_batch_size = cfg.algo, max(1, cfg.train.micro_batch_size)
        self.seed, self.train_cfg = cfg.train.seed, cfg.train
        self.temperature, self.max_len = cfg.rollout.temperature, cfg.rollout.max_new_tokens
        strategy.before_model()
        self.model, self.processor, self.peft = setup.build_model(cfg, adapter, weights)
        self.device = torch.device(f"cuda:{info.local_rank}" if torch.cuda.is_available()
                                   else "cpu")
        if not strategy.places_model:  # DeepSpeed and FSDP2 place (and shard) it themselves
            self.model.to(self.device)
        # The module training forwards go through (a DeepSpeed engine, or the model itself).
        self.train_model, self.optimizer, self.scheduler = strategy.setup(self.model,
                                                                          cfg.train.steps)
        self.touch_towers = (TowerToucher(self.model, adapter, self.processor)
                             if strategy.every_module else None)
        self.suppress_ids = adapter.placeholder_token_ids(self.processor)
        self.shared_prefix, self.pack_stats = False, {}  # decided by choose_layout
        self.pad_id = self.processor.tokenizer.pad_token_id
        self.ref_model = None  # the KL reference, set by Checkpointer.reference
        self.nonfinite_skipped = self.nonfinite_streak = 0  # steps skipped for NaN/inf

    def choose_layout(self, wanted: bool) -> None:
        """One packed row per group: the prompt and its media run once, not G times (same
        logprobs and gradients to 1e-5); flash_attention_2 switches to the varlen kernel. Called
        once the rollout engine is built, so the engine starts from the model as loaded."""
        self.shared_prefix, why = enable_shared_prefix(self.model, wanted)
        self.pack_stats: dict = {}  # pad_fraction of the last packed forward
        if self.info.main:
            print(why, flush=True)

    def full_params(self, enabled: bool = True):
        """Inside: every weight whole on every rank (generation, weight sync, evaluation)."""
        return self.strategy.full_params(self.model) if enabled else nullcontext()

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # ---------------------------------------------------------------- logprobs -----------------
    def micro_batches(self, n: int) -> list[list[int]]:
        mb = self.micro_batch_size
        return [list(range(i, min(n, i + mb))) for i in range(0, n, mb)]

    def forward(self, model, batch: RolloutBatch, rows: list[int], entropy: bool = False):
        """-> (logp [rows, width] (, entropy)), width) for `rows`, trimmed to their longest
        completion; under ZeRO-2/3 / FSDP2 every encoder runs, media present or not."""
        with self.touch_towers() if self.touch_towers else nullcontext():
            return self._forward_rows(model, batch, rows, entropy)

    def _forward_rows(self, model, batch: RolloutBatch, rows: list[int], entropy: bool):
        sub = batch.select(rows)
        width = int(sub.completion_mask.sum(1).max().clamp(min=1))  # drop all-pad columns
        ids, mask = sub.completion_ids[:, :width], sub.completion_mask[:, :width]
        if self.shared_prefix:
            return shared_prefix_logprobs(
                model, sub.prompts, ids.to(self.device), mask.to(self.device),
                temperature=self.temperature, return_entropy=entropy,
                placeholder_ids=self.suppress_ids, pad_id=self.pad_id, stats=self.pack_stats), width
        inputs = collate(sub.prompts, ids, mask, self.pad_id)
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        out = completion_logprobs(model, inputs, ids.to(self.device), mask.to(self.device),
                                  temperature=self.temperature,
                                  return_entropy=entropy, placeholder_ids=self.suppress_ids)
        return out, width

    @torch.no_grad()
    def logprobs(self, model, batch: RolloutBatch) -> torch.Tensor:
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        model.eval()
        for rows in self.micro_batches(batch.n):
            logp, width = self.forward(model, batch, rows)
            out[rows, :width] = logp.float().cpu()
        return out

    def old_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Stored before the first update when the rollout is reused (num_iterations > 1) or the
        KL goes into the reward (it needs the policy's logprobs before the update)."""
        ac = self.algo
        if ac.num_iterations > 1 or ac.kl_reward_coef > 0:
            return self.logprobs(self.train_model, batch)
        return None

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        if self.ref_model is not None:
            return self.logprobs(self.ref_model, batch)
        if self.algo.uses_reference and self.peft is not None:  # LoRA: reference = adapter off
            with lora.reference_context(self.peft):
                return self.logprobs(self.model, batch)
        return None

    # ---------------------------------------------------------------- update -------------------
    def update(self, sb: ScoredBatch, step: int) -> dict[str, float]:
        """One optimizer step per iteration over `sb`; `step` (steps done) seeds the random
        token selection of clip_cov / kl_cov, so a resumed run draws the same tokens."""
        ac, batch = self.algo, sb.rollout
        mask = batch.completion_mask.float()
        if ac.overlong_filter:
            mask = algos.overlong_filter_mask(mask, batch.truncated)
        # The normaliser is global so that summing micro-batch losses equals the one-shot loss.
        local = algos.loss_normalizer(mask, ac.agg)
        normalizer = float(dist.all_sum(local, self.info).clamp(min=1))
        sums: dict[str, float] = {}
        self.model.train()
        chunks = self.micro_batches(batch.n)
        cov = {"cov_ratio": ac.cov_ratio, "cov_lb": ac.cov_lb, "cov_ub": ac.cov_ub,  # clip/kl_cov
               "kl_cov_coef": ac.kl_cov_coef,
               "generator": torch.Generator().manual_seed(self.seed * 100_003 + step)}
        gap = 0.0  # the rollout engine's logprobs against the trainer's, same weights
        stepped = True
        for it in range(ac.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            it_loss = 0.0
            for i, rows in enumerate(chunks):
                (logp, ent), width = self.forward(self.train_model, batch, rows, entropy=True)
                m = mask[rows, :width].to(logp.device)
                old = logp.detach() if sb.old_logp is None else sb.old_logp[rows, :width]
                if it == 0 and batch.sampler_logp is not None:
                    gap = max(gap, _max_gap(old, batch.sampler_logp[rows, :width], m))
                weights = None
                if ac.tis_cap and batch.sampler_logp is not None:  # rollout-engine mismatch
                    weights = algos.is_weights(old.to(logp.device),
                                               batch.sampler_logp[rows, :width].to(logp.device), m,
                                               cap=ac.tis_cap, level=ac.tis_level, mode=ac.tis_mode)
                ref = None if sb.ref_logp is None else sb.ref_logp[rows, :width].to(logp.device)
                loss, metrics = algos.policy_loss(
                    logp, old.to(logp.device), sb.advantages[rows].to(logp.device), m,
                    clip_low=ac.clip_low, clip_high=ac.clip_high, agg=ac.agg, ratio=ac.ratio,
                    ref_logp=ref, beta=ac.beta, kl=ac.kl, max_len=self.max_len,
                    normalizer=normalizer, token_weights=weights, loss_type=ac.loss_type,
                    dual_clip=ac.dual_clip, entropy=ent, entropy_coef=ac.entropy_coef,
                    kl_clamp=ac.kl_clamp, cov=cov)
                self.strategy.backward(loss, last=i == len(chunks) - 1)
                it_loss += float(loss.detach())
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
        sums["grad_norm"] = self.strategy.step(self.model, self.optimizer)
        return math.isfinite(sums["grad_norm"])

    def metrics(self) -> dict[str, float]:
        out = {"lr": self.lr, "train/shared_prefix": float(self.shared_prefix)}
        if self.shared_prefix:
            out["train/pad_fraction"] = self.pack_stats.get("pad_fraction", 0.0)
        return out

    # ---------------------------------------------------------------- state --------------------
    def state_dict(self) -> dict:
        """The learner's part of a checkpoint's trainer state; sharded strategies write their
        optimizer state as shards (`strategy.save_shards`) instead."""
        state = {"scheduler": self.scheduler.state_dict(),
                 "parallel": {"name": self.strategy.name, "world": self.info.world}}
        if not self.strategy.sharded_checkpoint:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict, ckpt) -> None:
        saved = state.get("parallel", {"name": "ddp", "world": 1})
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        elif (saved["name"], saved["world"]) != (self.strategy.name, self.info.world):
            raise RuntimeError(
                f"{ckpt} holds {saved['name']} shards from {saved['world']} processes; resume it "
                f"with the same launcher and process count, or turn it into a model with "
                f"`mmrl checkpoint consolidate {ckpt}` and start a new run from that (model.path)")
        else:
            self.strategy.load_shards(ckpt, self.model, self.optimizer)
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


def _max_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> float:
    diff = (trainer_logp.float().cpu() - sampler_logp.float().cpu()).abs()[mask.cpu().bool()]
    return float(diff.max()) if diff.numel() else 0.0
