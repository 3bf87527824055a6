"""Optional supervised warm-up before RL: imitate `sft.target` (e.g. "<answer>3</answer>") on
training samples until held-out greedy accuracy reaches `sft.stop_accuracy` (on `sft.stop_checks`
checks in a row).

Why: a fresh tiny model never emits the answer format, so every group has zero reward variance
and RL has nothing to learn from. A short warm-up teaches the format; RL then improves accuracy.
Stop on a validation criterion, not a step count: greedy accuracy jumps within a few steps.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from mmrl.config import RunConfig, SFTConfig
from mmrl.data.media import MediaError
from mmrl.models.forward import collate, completion_logprobs
from mmrl.rollout.environments import make_environments
from mmrl.rollout.trajectory import TrajectoryRollout
from mmrl.train import dist
from mmrl.train.evaluate import evaluate
from mmrl.train.logging import RunLogger
from mmrl.train.policy import Policy
from mmrl.train.prompts import PromptSource
from mmrl.types import PromptFeatures, RolloutBatch, Sample, SamplingParams


def fill(target: str, sample: Sample, key: str = "sft.target") -> str:
    """`target` with `{solution}` and the record's fields filled in (e.g. {patch_box} for a tool
    call's box); a field the record lacks is an error naming it, the record and its fields."""
    try:
        return target.format(**{**sample.fields, "solution": sample.solution})
    except KeyError as e:
        raise ValueError(f"{key} names {{{e.args[0]}}}, which record {sample.id} "
                         f"({sample.source}) does not have; its fields: "
                         f"{', '.join(sorted(sample.fields)) or 'none'}") from None


def target_text(sc: SFTConfig, sample: Sample) -> str:
    """The completion to imitate: `sft.think_target` for a sample the think/no-think hybrid asked
    to think (when set), else `sft.target`."""
    asked_to_think = sample.fields.get("think_mode") == "think"
    return fill(sc.think_target if sc.think_target and asked_to_think else sc.target, sample)


def _targets(sc: SFTConfig, tokenizer, pad_id: int,
             samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer(target_text(sc, s), add_special_tokens=False)
            ["input_ids"] + [tokenizer.eos_token_id] for s in samples]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


class Demonstrations:
    """Demonstration trajectories for the warm-up (`sft.turn_targets`): the trajectory loop of
    rollouts (mmrl/rollout/trajectory.py) over an engine whose turn k "samples" target k filled
    from the record, so the observations are the real tools' answers, encoded as in RL, and the
    loss mask covers the model's turns only. A row ends at the first target that answers, so
    one list serves records that answer at turn 1 and records that call again.

    A record's demonstration is the same at every step (its targets are filled from its fields,
    and the tools are functions of their arguments), so with `keys` (the records' dataset
    indices) each is built once and kept, as the prompt features are (data.feature_cache records,
    least recently used out): on the visual_search row this was 40% of the warm-up's time."""

    def __init__(self, cfg: RunConfig, policy: Policy, envs=None):
        """`envs`: the run's environment kind (the tools; built once per run, None: here)."""
        self.targets, self.tokenizer = cfg.sft.turn_targets, policy.codec.tokenizer
        if envs is None:
            envs = make_environments(cfg, policy.codec)
        self.loop = TrajectoryRollout.for_run(cfg, self, policy.codec, envs)
        # As many turns as targets, whatever tools.max_turns: a demonstration may look again
        # after a miss (a turn more than RL allows, whose cap RL then unlearns). One turn more,
        # so a last target that still calls is the error below, not a silent turn cap.
        self.loop.settings = dataclasses.replace(self.loop.settings,
                                                 max_turns=len(self.targets) + 1)
        self.params = SamplingParams(num_generations=1, max_new_tokens=cfg.rollout.max_new_tokens)
        self.turn = 0
        self.pad_id, self.cache_size = policy.codec.pad_id, cfg.data.feature_cache
        self._rows: OrderedDict[int, RolloutBatch] = OrderedDict()

    def demonstrate(self, feats: list[PromptFeatures],
                    keys: list[int] | None = None) -> RolloutBatch:
        if keys is None or self.cache_size <= 0:
            return self._rollout(feats)
        todo = list({k: i for i, k in enumerate(keys) if k not in self._rows}.values())
        if todo:
            made = self._rollout([feats[i] for i in todo])
            for j, i in enumerate(todo):
                self._rows[keys[i]] = _trimmed(made.select([j]))
        rows = [self._rows[k] for k in keys]
        for k in keys:  # most recently used last; the oldest leave past the bound
            self._rows.move_to_end(k)
        while len(self._rows) > self.cache_size:
            self._rows.popitem(last=False)
        batch = RolloutBatch.cat(rows, self.pad_id)
        return dataclasses.replace(batch, group_ids=torch.arange(batch.n))

    def _rollout(self, feats: list[PromptFeatures]) -> RolloutBatch:
        """The demonstrations of `feats`; a call its tool answered with an error is a
        ValueError naming the record: the warm-up would teach the model to read that error."""
        self.turn = 0
        batch = self.loop.rollout(feats, self.params)
        for p, t in zip(feats, batch.trajectories or []):
            bad = next((c for c in t.calls if c.error), None)
            if bad is not None:
                raise ValueError(f"sft.turn_targets: {p.sample.source or p.sample.id}'s "
                                 f"demonstration called {bad.name or 'a tool'} at turn "
                                 f"{bad.turn + 1}, which answered {bad.error}: "
                                 f"{bad.message[:300]} -- a warm-up on it would teach reading "
                                 f"that error; fix the target or the tool's settings")
        return batch

    def generate(self, prompts: list[PromptFeatures], params: SamplingParams) -> RolloutBatch:
        """The engine contract (one turn of every row still going)."""
        if self.turn >= len(self.targets):
            raise ValueError(f"sft.turn_targets: the demonstration's turn {self.turn} (of "
                             f"{len(self.targets)}) still called a tool; its last target must "
                             f"answer, e.g. <answer>{{solution}}</answer>")
        key = f"sft.turn_targets[{self.turn}]"
        eos = self.tokenizer.eos_token_id
        rows = [self.tokenizer(fill(self.targets[self.turn], p.sample, key),
                               add_special_tokens=False)["input_ids"] + [eos] for p in prompts]
        self.turn += 1
        if max(map(len, rows)) > params.max_new_tokens:
            raise ValueError(f"{key} is {max(map(len, rows))} tokens with its end token, over "
                             f"the turn's limit of {params.max_new_tokens} "
                             f"(rollout.max_new_tokens, or what is left of tools.max_tokens)")
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        return RolloutBatch(prompts=list(prompts), completion_ids=ids, completion_mask=mask,
                            group_ids=torch.arange(len(rows)),
                            sampler_logp=torch.zeros(ids.shape),
                            texts=[self.tokenizer.decode(r, skip_special_tokens=True)
                                   for r in rows],
                            truncated=torch.zeros(len(rows), dtype=torch.bool))


def _trimmed(row: RolloutBatch) -> RolloutBatch:
    """One row without the batch's padding past its own end."""
    n = int(row.completion_mask.sum())
    return dataclasses.replace(row, completion_ids=row.completion_ids[:, :n],
                               completion_mask=row.completion_mask[:, :n],
                               sampler_logp=row.sampler_logp[:, :n],
                               loss_mask=row.loss_mask[:, :n])


def reached(history: list[dict], stop_accuracy: float | None, checks: int,
            key: str = "val_accuracy") -> bool:
    """Whether the last `checks` val readings of `key` all reached `stop_accuracy` (None: never)."""
    last = [h[key] for h in history[-checks:]]
    return stop_accuracy is not None and len(last) == checks and min(last) >= stop_accuracy


def stop_reading(result: dict, metric: str) -> float:
    """`sft.stop_metric` out of a held-out evaluation's result, or an error naming what it has."""
    if metric not in result:
        have = ", ".join(k for k, v in result.items() if isinstance(v, float))
        raise ValueError(f"sft.stop_metric {metric!r} is not in the warm-up's held-out "
                         f"evaluation; it has: {have} (a reward's mean is <key>_mean, for a "
                         f"reward in `rewards`, weight 0 to log it only)")
    return float(result[metric])


def _other(sc: SFTConfig, reading: dict) -> str:
    """The stop metric beside accuracy in the progress line, when it is another one."""
    return "" if sc.stop_metric == "accuracy" else f"  {sc.stop_metric} {reading['val_stop']:.3f}"


def _step(sc: SFTConfig, policy: Policy, prompts: PromptSource, demos: Demonstrations | None,
          idx: list[int]) -> torch.Tensor:
    """One warm-up step's gradients (summed over the ranks) -> its loss. Every rank draws the
    same batch and trains on its contiguous share of it; the loss is normalised by the token
    count of the whole batch, so N processes step exactly as one does, in 1/N of the time."""
    model, info, device = policy.model, policy.info, policy.device
    mine = idx[len(idx) * info.rank // info.world:len(idx) * (info.rank + 1) // info.world]
    kept, samples, feats = prompts.load(mine)  # bad media: skipped and counted, or an error
    if int(dist.all_sum(len(samples), info)) == 0:
        raise MediaError(f"SFT warm-up: none of the {len(idx)} samples drawn could be loaded")
    params = [p for p in model.parameters() if p.requires_grad]
    loss_sum, tokens = torch.zeros(()), torch.zeros(())
    if samples:  # a rank whose whole share failed to load adds zero gradient
        if demos is not None:  # the model's turns of a trajectory through the real tools
            batch = demos.demonstrate(feats, kept)
            ids, mask = batch.completion_ids, batch.policy_mask
            inputs = collate(batch.prompts, ids, batch.completion_mask, policy.codec.pad_id,
                             observations=batch.observations())
        else:
            ids, mask = _targets(sc, policy.codec.tokenizer, policy.codec.pad_id, samples)
            inputs = collate(feats, ids, mask, policy.codec.pad_id)
        model.train()
        logp = completion_logprobs(model, {k: v.to(device) if torch.is_tensor(v) else v
                                           for k, v in inputs.items()},
                                   ids.to(device), mask.to(device))
        loss_sum, tokens = -(logp * mask.to(logp.device)).sum(), mask.sum()
    total = float(dist.all_sum(tokens, info))
    if samples:
        (loss_sum / total).backward()
    dist.all_reduce_grads(params, info)
    return dist.all_sum(loss_sum.detach(), info) / total


def sft_warmup(cfg: RunConfig, policy: Policy, prompts: PromptSource, log: RunLogger,
               stop=None) -> dict:
    """Trains `policy.model` in place on samples of `prompts.dataset` (the first
    `sft.val_samples` held out for the stopping criterion) -> {"steps", "val_accuracy", "history"}
    (and "stopped": True when `stop()`, asked before each step, said so: a stop signal)."""
    sc, model, data, device = cfg.sft, policy.model, prompts.dataset, policy.device
    n_val = min(sc.val_samples, len(data) // 4)
    val = data[:n_val]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=sc.lr)
    gen = torch.Generator().manual_seed(cfg.train.seed + 1)
    history, acc, step = [], float("nan"), 0
    demos = Demonstrations(cfg, policy, prompts.envs) if sc.turn_targets else None
    in_a_row = "" if sc.stop_checks == 1 else f" on {sc.stop_checks} checks in a row"
    what = "val accuracy" if sc.stop_metric == "accuracy" else f"val {sc.stop_metric}"
    log.print(f"SFT warm-up: {sc.steps} steps, {what} every {sc.eval_every}"
              if sc.stop_accuracy is None else
              f"SFT warm-up: up to {sc.steps} steps, stop at {what} {sc.stop_accuracy}{in_a_row}")
    log.start(total=sc.steps, description="SFT warm-up")  # progress between the checks
    for step in range(1, sc.steps + 1):
        if stop is not None and stop():
            return {"steps": step - 1, "val_accuracy": acc, "history": history, "stopped": True}
        idx = (torch.randint(n_val, len(data), (sc.batch_size,), generator=gen)).tolist()
        opt.zero_grad(set_to_none=True)
        loss = _step(sc, policy, prompts, demos, idx)
        opt.step()
        checks = step % sc.eval_every == 0 or step == sc.steps
        if checks:
            result = evaluate(model, policy.codec, val, cfg, info=policy.info, envs=prompts.envs)
            acc = result["accuracy"]
            history.append({"step": step, "loss": float(loss.detach()), "val_accuracy": acc,
                            "val_stop": stop_reading(result, sc.stop_metric)})
        seen = (f"  val accuracy {acc:.3f}{_other(sc, history[-1])}" if checks else
                f"  (val accuracy {acc:.3f} at step {history[-1]['step']})" if history else "")
        log.advance(step, sc.steps, f"loss {float(loss.detach()):.3f}{seen}", label="sft step",
                    keep=checks)
        if checks and reached(history, sc.stop_accuracy, sc.stop_checks, "val_stop"):
            break
    log.stop()
    return {"steps": step, "val_accuracy": acc, "history": history}
