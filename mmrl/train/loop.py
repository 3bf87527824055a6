"""The GRPO-family training loop. One step, in stages:

    prompts  -> rollout (G completions each) -> rewards -> [dynamic sampling] -> advantages
             -> old/ref logprobs -> update (micro-batches, accumulate, clip, step) -> log/checkpoint

This is the only module that knows about devices, micro-batches and the optimizer.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import asdict

import torch

from mmrl import algos
from mmrl.config import RunConfig, save as save_config
from mmrl.data.media import MediaError, processor_errors
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import enable_shared_prefix, shared_prefix_logprobs
from mmrl.models.towers import TowerToucher
from mmrl.rollout import make_engine
from mmrl.rollout.hf import HFEngine
from mmrl.train import checkpoint, dist, lora, methods, parallel, setup
from mmrl.train.logging import RunLogger
from mmrl.train.rollout_utils import concat_rollouts, rollout_metrics, rollout_records
from mmrl.data.inspect import check_scorable
from mmrl.train.scoring import RewardSet
from mmrl.types import PromptFeatures, RolloutBatch, Sample, SamplingParams, ScoredBatch


class Trainer:
    def __init__(self, cfg: RunConfig, logger: RunLogger | None = None):
        self.cfg = cfg
        setup.check_environment(cfg)
        self.dist = dist.init()
        self.parallel = parallel.make(cfg, self.dist)
        setup.set_seed(cfg.train.seed)
        self.run_dir = cfg.run_dir
        self.train_set, self.eval_set = setup.build_datasets(cfg)
        check_scorable(cfg.rewards, self.train_set, cfg.rollout.max_new_tokens)
        self.adapter = get_adapter(cfg.model.family)
        resume = checkpoint.resolve_resume(cfg.train.resume, self.run_dir)
        self.parallel.before_model()
        self.model, self.processor, self.peft = setup.build_model(
            cfg, self.adapter, resume if checkpoint.has_weights(resume) else None)
        self.device = torch.device(f"cuda:{self.dist.local_rank}" if torch.cuda.is_available()
                                   else "cpu")
        if self.parallel.name == "ddp":  # DeepSpeed and FSDP2 place (and shard) it themselves
            self.model.to(self.device)
        # The module training forwards go through (a DeepSpeed engine, or the model itself).
        self.train_model, self.optimizer, self.scheduler = self.parallel.setup(self.model,
                                                                               cfg.train.steps)
        self.touch_towers = (TowerToucher(self.model, self.adapter, self.processor)
                             if self.parallel.every_module else None)
        self.suppress_ids = self.adapter.placeholder_token_ids(self.processor)
        with self.parallel.full_params(self.model):
            self.engine = make_engine(cfg.rollout, self.model, self.processor, self.adapter)
        # One packed row per group: the prompt and its media run once, not G times (same
        # logprobs and gradients to 1e-5); flash_attention_2 switches to the varlen kernel.
        self.shared_prefix, why = enable_shared_prefix(self.model, cfg.train.shared_prefix)
        if self.dist.main:
            print(why, flush=True)
        self.pack_stats: dict = {}  # pad_fraction of the last packed forward
        self.pad_id = self.processor.tokenizer.pad_token_id
        self.rewards = RewardSet(cfg.rewards)
        self.media_stats: dict[str, int] = {}  # e.g. audio_truncated, counted into metrics
        self.load_media = setup.media_loader(cfg, self.media_stats)
        self.sampler = setup.PromptSampler(len(self.train_set), cfg.train.seed, cfg.data.shuffle,
                                           blocks=getattr(self.train_set, "blocks", None))
        self.ref_model = None
        self.step, self.skipped, self.state_extra = 0, 0, {}
        self.nonfinite_skipped = self.nonfinite_streak = 0  # steps skipped for NaN/inf
        # Methods from the papers (mmrl/train/methods.py): prompt history, GT-guided rows.
        self.history, self.history_stats, self.guided = methods.make_history(cfg), {}, None
        self._features: OrderedDict[int, PromptFeatures] = OrderedDict()
        main = self.dist.main  # only rank 0 writes the run dir; other ranks keep a local log
        self.log = logger or RunLogger(
            self.run_dir if main else self.run_dir / f"rank{self.dist.rank}",
            tensorboard=cfg.log.tensorboard and main, wandb=cfg.log.wandb and main,
            progress=cfg.log.progress if main else "silent", log_every=cfg.log.log_every,
            config=asdict(cfg))
        if main:
            save_config(cfg, self.run_dir / "config.yaml")
        if resume is not None:
            self._restore(resume)

    # ---------------------------------------------------------------- stage: prompts -----------
    def features(self, sample: Sample, key: int | None = None) -> PromptFeatures:
        """One processor call per sample, reused by rollout and every training forward."""
        if key is not None and key in self._features:
            self._features.move_to_end(key)
            return self._features[key]
        sample = methods.hybrid_sample(self, sample)  # think / no-think instruction (off: as is)
        media = self.load_media(sample)
        with processor_errors(sample):  # e.g. aspect ratio: a media error naming the record
            feats = self.adapter.prompt_features(self.processor, sample, **media)
        feats.media = media
        if key is not None and self.cfg.data.feature_cache > 0:  # bounded: media tensors are big
            self._features[key] = feats
            while len(self._features) > self.cfg.data.feature_cache:
                self._features.popitem(last=False)
        return feats

    def next_prompts(self, n: int) -> list[PromptFeatures]:
        """Draw n prompts (the global batch: every rank draws the same ones and keeps its slice,
        so groups stay whole); bad media raises (on_bad_sample=error) or is skipped and counted
        (a replacement is drawn locally, so ranks' orders may then drift apart)."""
        todo = [self.sampler.next() for _ in range(n)][dist.local_slice(n, self.dist)]
        want, out = len(todo), []
        while len(out) < want:
            idx = todo.pop(0) if todo else self.sampler.next()
            if methods.history_skips(self, self.train_set[idx]):
                continue
            try:
                out.append(self.features(self.train_set[idx], idx))
            except MediaError as e:
                if self.cfg.data.on_bad_sample != "skip":
                    raise MediaError(f"{e}\n(set data.on_bad_sample=skip to skip such samples "
                                     f"and count them in metrics)") from None
                self.skipped += 1
                if self.skipped > len(self.train_set):
                    raise RuntimeError("every training sample failed to load") from e
        return out

    # ---------------------------------------------------------------- stage: rollout -----------
    @torch.no_grad()
    def rollout(self, prompts: list[PromptFeatures], group_offset: int = 0) -> RolloutBatch:
        rc = self.cfg.rollout
        self.model.eval()
        # HF generate under ZeRO-3 / FSDP2: the weights are gathered once, not once per token.
        hf = isinstance(self.engine, HFEngine)
        with self.parallel.full_params(self.model) if hf else nullcontext():
            ids, mask, slogp, truncated = self.engine.generate(
                prompts, SamplingParams.from_rollout(rc, suppress_ids=self.suppress_ids))
        g = rc.num_generations
        texts = self.processor.tokenizer.batch_decode(
            [row[m.bool()] for row, m in zip(ids, mask)], skip_special_tokens=True)
        return RolloutBatch(
            prompts=[p for p in prompts for _ in range(g)], completion_ids=ids,
            completion_mask=mask, texts=texts, truncated=truncated, sampler_logp=slogp,
            group_ids=torch.arange(len(prompts)).repeat_interleave(g) + group_offset)

    # ---------------------------------------------------------------- stage: rewards -----------
    def score(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, list]]:
        lengths = batch.completion_mask.sum(1).tolist()
        extra = {"completion_length": lengths, "group_id": batch.group_ids.tolist(),
                 "max_completion_length": [self.cfg.rollout.max_new_tokens] * batch.n}
        totals, per = self.rewards.score([p.sample for p in batch.prompts], batch.texts, extra)
        return torch.tensor(totals, dtype=torch.float32), per

    def sample_batch(self) -> tuple[RolloutBatch, torch.Tensor, dict[str, list], dict]:
        """Rollout + rewards; with dynamic sampling, keep only groups with reward signal and
        sample more prompts until the batch is full (DAPO)."""
        ac, b = self.cfg.algo, self.cfg.rollout.prompts_per_step
        if not ac.dynamic_sampling:
            batch = self.rollout(self.next_prompts(b), group_offset=self._group_base(b))
            scores, per = self.score(batch)
            methods.history_observe(self, batch, scores)
            return batch, scores, per, {"sampling/rounds": 1}
        acc = algos.GroupAccumulator(target_groups=b // self.dist.world,
                                     max_rounds=ac.max_sampling_rounds)
        pieces, offset = [], 0
        while not acc.full:
            batch = self.rollout(self.next_prompts(b), group_offset=self._group_base(b) + offset)
            offset += b * self.dist.world
            scores, per = self.score(batch)
            methods.history_observe(self, batch, scores)
            ids, keep = algos.groups_with_signal(scores, batch.group_ids)
            acc.add(ids.tolist(), keep)  # raises with advice after max_rounds
            rows = torch.isin(batch.group_ids, ids[keep]).nonzero().flatten().tolist()
            pieces.append((batch.select(rows), scores[rows],
                           {k: [v[i] for i in rows] for k, v in per.items()}))
        batch, scores, per = concat_rollouts(pieces, self.pad_id)
        rows = torch.isin(batch.group_ids, torch.tensor(acc.take())).nonzero().flatten().tolist()
        return (batch.select(rows), scores[rows], {k: [v[i] for i in rows] for k, v in per.items()},
                {"sampling/rounds": acc.round})

    def _group_base(self, b: int) -> int:
        """Group ids unique across ranks: rank r's groups start at r * (its share of b)."""
        return dist.local_slice(b, self.dist).start

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
        """Advantages over the global batch (all ranks' scores), returned for the local rows."""
        ac = self.cfg.algo
        all_scores, start = dist.gather_cat(scores, self.dist)
        all_groups, _ = dist.gather_cat(group_ids, self.dist)
        all_lengths, _ = dist.gather_cat(lengths, self.dist)
        adv = algos.compute_advantages(ac.advantage, all_scores, all_groups, lengths=all_lengths,
                                       scale=ac.scale_rewards)
        adv = algos.weight_by_sign(adv, ac.pos_weight, ac.neg_weight)
        return adv[start:start + scores.numel()]

    # ---------------------------------------------------------------- stage: logprobs ----------
    def micro_batches(self, n: int) -> list[list[int]]:
        mb = max(1, self.cfg.train.micro_batch_size)
        return [list(range(i, min(n, i + mb))) for i in range(0, n, mb)]

    def _forward(self, model, batch: RolloutBatch, rows: list[int], entropy: bool = False):
        with self.touch_towers() if self.touch_towers else nullcontext():
            return self._forward_rows(model, batch, rows, entropy)

    def _forward_rows(self, model, batch: RolloutBatch, rows: list[int], entropy: bool):
        sub = batch.select(rows)
        width = int(sub.completion_mask.sum(1).max().clamp(min=1))  # drop all-pad columns
        ids, mask = sub.completion_ids[:, :width], sub.completion_mask[:, :width]
        if self.shared_prefix:
            return shared_prefix_logprobs(
                model, sub.prompts, ids.to(self.device), mask.to(self.device),
                temperature=self.cfg.rollout.temperature, return_entropy=entropy,
                placeholder_ids=self.suppress_ids, pad_id=self.pad_id, stats=self.pack_stats), width
        inputs = collate(sub.prompts, ids, mask, self.pad_id)
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        out = completion_logprobs(model, inputs, ids.to(self.device), mask.to(self.device),
                                  temperature=self.cfg.rollout.temperature,
                                  return_entropy=entropy, placeholder_ids=self.suppress_ids)
        return out, width

    @torch.no_grad()
    def logprobs(self, model, batch: RolloutBatch) -> torch.Tensor:
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        model.eval()
        for rows in self.micro_batches(batch.n):
            logp, width = self._forward(model, batch, rows)
            out[rows, :width] = logp.float().cpu()
        return out

    # ---------------------------------------------------------------- stage: update ------------
    def update(self, sb: ScoredBatch) -> dict[str, float]:
        ac, batch = self.cfg.algo, sb.rollout
        mask = batch.completion_mask.float()
        if ac.overlong_filter:
            mask = algos.overlong_filter_mask(mask, batch.truncated)
        # The normaliser is global so that summing micro-batch losses equals the one-shot loss.
        local = algos.loss_normalizer(mask, ac.agg)
        normalizer = float(dist.all_sum(local, self.dist).clamp(min=1))
        sums: dict[str, float] = {}
        self.model.train()
        chunks = self.micro_batches(batch.n)
        cov = {"cov_ratio": ac.cov_ratio, "cov_lb": ac.cov_lb, "cov_ub": ac.cov_ub,  # clip/kl_cov
               "kl_cov_coef": ac.kl_cov_coef,
               "generator": torch.Generator().manual_seed(self.cfg.train.seed * 100_003 + self.step)}
        gap = 0.0  # the rollout engine's logprobs against the trainer's, same weights
        stepped = True
        for it in range(ac.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            it_loss = 0.0
            for i, rows in enumerate(chunks):
                (logp, ent), width = self._forward(self.train_model, batch, rows, entropy=True)
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
                    ref_logp=ref, beta=ac.beta, kl=ac.kl, max_len=self.cfg.rollout.max_new_tokens,
                    normalizer=normalizer, token_weights=weights, loss_type=ac.loss_type,
                    dual_clip=ac.dual_clip, entropy=ent, entropy_coef=ac.entropy_coef,
                    kl_clamp=ac.kl_clamp, cov=cov)
                self.parallel.backward(loss, last=i == len(chunks) - 1)
                it_loss += float(loss.detach())
                frac = len(rows) / batch.n  # metrics are micro-batch means: weight by rows
                metrics = {**metrics, "loss": loss.detach() / frac,
                           "entropy": (ent * m).sum() / m.sum().clamp(min=1)}
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v) * frac / ac.num_iterations
            # A NaN/inf loss never reaches the optimizer (nor does a NaN/inf grad norm: the
            # strategy's step skips it): the step is skipped and counted.
            if dist.all_sum(float(not math.isfinite(it_loss)), self.dist) > 0:
                self.optimizer.zero_grad(set_to_none=True)
                sums["grad_norm"], stepped = float("nan"), False
            else:
                sums["grad_norm"] = self.parallel.step(self.model, self.optimizer)
                stepped = stepped and math.isfinite(sums["grad_norm"])
        if stepped:
            self.scheduler.step()
        self.nonfinite_streak = 0 if stepped else self.nonfinite_streak + 1
        self.nonfinite_skipped += not stepped
        out = {f"loss/{k}" if k not in ("grad_norm", "entropy") else k: v for k, v in sums.items()}
        out["train/nonfinite_skipped"] = self.nonfinite_skipped
        if batch.sampler_logp is not None:  # ~1e-6 in float32; bf16 engines drift more (tis_cap)
            out["rollout/logp_gap_max"] = gap
        return out

    # ---------------------------------------------------------------- one step -----------------
    def train_step(self) -> dict[str, float]:
        timer = StageTimer()
        with timer("rollout"):
            batch, scores, per_reward, extra = self.sample_batch()
            scores, tgrpo = methods.temporal_contrast(self, batch, scores, per_reward)
            batch, scores, per_reward, self.guided, gt = methods.inject_ground_truth(
                self, batch, scores, per_reward)
        extra.update({**gt, **tgrpo})
        return self.learn(batch, scores, per_reward, extra, timer)

    def learn(self, batch: RolloutBatch, scores: torch.Tensor, per_reward: dict[str, list],
              extra: dict | None = None, timer: "StageTimer | None" = None) -> dict[str, float]:
        """Everything after sampling: advantages, old/ref logprobs, update, metrics."""
        ac, timer, extra = self.cfg.algo, timer or StageTimer(), extra or {}
        sb = ScoredBatch(rollout=batch, scores=scores, per_reward=per_reward, advantages=scores)
        with timer("logprob"):
            if ac.num_iterations > 1 or ac.kl_reward_coef > 0:
                sb.old_logp = self.logprobs(self.train_model, batch)
            if self.ref_model is not None:
                sb.ref_logp = self.logprobs(self.ref_model, batch)
            elif ac.uses_reference and self.peft is not None:  # LoRA: reference = adapter disabled
                with lora.reference_context(self.peft):
                    sb.ref_logp = self.logprobs(self.model, batch)
        with timer("advantage"):
            rewards = self.kl_in_reward(sb, extra) if ac.kl_reward_coef > 0 else scores
            rewards = methods.guided_scores(self, rewards, batch.group_ids)
            sb.advantages = self.advantages(rewards, batch.group_ids, batch.completion_mask.sum(1))
            sb.advantages = methods.history_advantages(self, sb.advantages, batch)
        with timer("update"):
            metrics = self.update(sb)
        if ac.ref_reset_every and (self.step + 1) % ac.ref_reset_every == 0:
            self.reset_reference()
        with timer("sync"):
            self.sync_engine()
        self.step += 1
        metrics.update(extra)
        metrics.update(methods.history_end_step(self))
        metrics.update(methods.label_free_metrics(self, batch))
        metrics.update(methods.think_metrics(self, batch))
        metrics.update(rollout_metrics(sb, self.rewards.keys))
        metrics.update(self.rewards.step_metrics(self.log.warn))
        metrics.update(timer.metrics())
        tokens = int(batch.completion_mask.sum()) + sum(p.input_ids.numel() for p in batch.prompts)
        metrics["time/tokens_per_s"] = tokens / max(timer.total, 1e-9)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["data/skipped"] = self.skipped
        metrics["train/shared_prefix"] = float(self.shared_prefix)
        if self.shared_prefix:
            metrics["train/pad_fraction"] = self.pack_stats.get("pad_fraction", 0.0)
        metrics.update({f"data/{k}": v for k, v in self.media_stats.items()})
        metrics = dist.mean_metrics(metrics, self.dist)
        if self.dist.enabled:  # each rank's loss is its part of the global sum
            metrics["loss/loss"] *= self.dist.world
        if self.cfg.log.rollouts_every and self.step % self.cfg.log.rollouts_every == 0:
            self.log.log_rollouts(self.step, rollout_records(sb, self.cfg.log.rollouts_per_step))
        return metrics

    def kl_in_reward(self, sb: ScoredBatch, extra: dict) -> torch.Tensor:
        """Scores minus coef * sum_t KL_t (verl use_kl_in_reward); the coefficient is fixed or
        adapted toward algo.kl_reward_target and carried through checkpoints (state extra)."""
        ac = self.cfg.algo
        ctl = algos.KLController(self.state_extra.get("kl_reward_coef", ac.kl_reward_coef),
                                 ac.kl_reward_target, ac.kl_reward_horizon)
        scores, kl = algos.kl_in_reward(sb.scores, sb.old_logp, sb.ref_logp,
                                        sb.rollout.completion_mask, ctl.coef, ac.kl_reward_kind)
        kl = float(dist.all_sum(kl, self.dist)) / self.dist.world
        extra.update({"kl_reward/kl": kl, "kl_reward/coef": ctl.coef})
        self.state_extra["kl_reward_coef"] = ctl.update(kl, sb.rollout.n * self.dist.world)
        return scores

    def reset_reference(self) -> None:
        """ProRL: the KL reference becomes a copy of the current policy (saved, so a resumed run
        keeps it). Only where both are whole modules in this process (checked at RL start)."""
        if self.ref_model is None:
            return
        with torch.no_grad():
            self.ref_model.load_state_dict(self.model.state_dict())
        if self.dist.main:
            self.ref_model.save_pretrained(self.run_dir / "reference")
        dist.barrier(self.dist)

    def sync_engine(self) -> None:
        """vLLM reloads the new weights (whole: gathered first when sharded); HF samples from the
        training model itself."""
        if isinstance(self.engine, HFEngine):
            return
        with self.parallel.full_params(self.model):
            self.engine.sync_weights(self.model)

    # ---------------------------------------------------------------- state --------------------
    def save(self) -> None:
        """A collective: rank 0 writes the model and state, sharded strategies every rank's part
        (replicated weights are identical on every rank after the all-reduced step)."""
        state = {"scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                 "skipped": self.skipped, "extra": self.state_extra,
                 "run_id": self.cfg.train.run_id,
                 "parallel": {"name": self.parallel.name, "world": self.dist.world}}
        if not self.parallel.sharded_checkpoint:
            state["optimizer"] = self.optimizer.state_dict()
        checkpoint.save(self.run_dir, self.step, self.peft or self.model, self.processor, state,
                        keep=self.cfg.train.keep_checkpoints, strategy=self.parallel,
                        optimizer=self.optimizer)

    def _restore(self, ckpt) -> None:
        state = checkpoint.load_state(ckpt, self.dist.rank, self.dist.world)
        saved = state.get("parallel", {"name": "ddp", "world": 1})
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        elif (saved["name"], saved["world"]) != (self.parallel.name, self.dist.world):
            raise RuntimeError(
                f"{ckpt} holds {saved['name']} shards from {saved['world']} processes; resume it "
                f"with the same launcher and process count, or turn it into a model with "
                f"`mmrl checkpoint consolidate {ckpt}` and start a new run from that (model.path)")
        else:
            self.parallel.load_shards(ckpt, self.model, self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.skipped, self.state_extra = state["skipped"], state.get("extra", {})
        if self.history is not None and "prompt_history" in self.state_extra:
            self.history.load_state_dict(self.state_extra["prompt_history"])
        self.step = state["step"]
        checkpoint.set_rng_state(state["rng"])
        self.log.print(f"resumed from {ckpt} at step {self.step}")

    def enable_reference(self) -> None:
        """The KL reference is the policy as RL starts (after any SFT warm-up). It is saved once
        in the run dir so that a resumed run keeps the same reference, not the resumed policy."""
        ac = self.cfg.algo
        if ac.ref_reset_every and (self.peft is not None or self.parallel.shards_params):
            raise ValueError("algo.ref_reset_every: resetting the reference needs full fine-tuning "
                             "without ZeRO-3/FSDP2 parameter sharding")
        if not ac.uses_reference or self.ref_model is not None or self.peft is not None:
            return
        path = self.run_dir / "reference"
        if not path.is_dir() and self.parallel.shards_params:  # no whole copy in memory
            weights = self.parallel.full_state_dict(self.model)
            if self.dist.main:
                self.model.save_pretrained(path, state_dict=weights)
                checkpoint.hf_config(self.model).save_pretrained(path)
                self.processor.save_pretrained(path)
            dist.barrier(self.dist)
        if path.is_dir():
            ref, _ = self.adapter.load(str(path), dtype=next(self.model.parameters()).dtype)
            if self.parallel.name == "ddp":
                ref.to(self.device)
            self.ref_model = self.parallel.frozen(setup.build_reference(ref, copy=False))
            if self.touch_towers is not None and self.parallel.shards_params:
                self.touch_towers.attach(self.ref_model)  # its forwards gather too
        else:
            self.ref_model = setup.build_reference(self.model)
            if self.dist.main:  # with the processor, so adapter.load can read it back
                self.ref_model.save_pretrained(path)
                self.processor.save_pretrained(path)


def _max_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> float:
    diff = (trainer_logp.float().cpu() - sampler_logp.float().cpu()).abs()[mask.cpu().bool()]
    return float(diff.max()) if diff.numel() else 0.0


class StageTimer:
    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t

    @property
    def total(self) -> float:
        return sum(self.times.values())

    def metrics(self) -> dict[str, float]:
        return {**{f"time/{k}": v for k, v in self.times.items()}, "time/step": self.total}
