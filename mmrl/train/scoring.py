"""Bind the configured rewards and score completions, routing each sample to its task's rewards.

A reward sees per-sample lists of every field of the samples it scores (plus `task`, `group_id`,
`completion_length`, `max_completion_length`); samples whose task is not in a reward's `tasks`
get None from it. The weighted total treats None as 0, so a sample is scored only by the rewards
that apply to it.

`step_metrics()` reports, per reward, the fraction of the step's samples of its tasks that it
scored (`reward/<key>/scored_frac`), and whether every advantage was 0 (`adv/all_zero`); the
watchers (train/watch.py) warn when either stays so for many steps.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
import inspect
import math
import numbers
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from rewards import get_reward
from rewards.calls import RewardError, call_reward

from mmrl import algos
from mmrl.config import RunConfig, RewardSpec
from mmrl.config_rules import reward_keys
from mmrl.tools import call_fields
from mmrl.train import dist
from mmrl.types import RolloutBatch, Sample, ScoredBatch


def bind_reward(spec: RewardSpec) -> Callable[..., list]:
    """Resolve a reward by name and bind its params; unknown params fail here, not mid-run."""
    try:
        fn = get_reward(spec.name)
    except KeyError as e:
        raise KeyError(f"rewards: {e.args[0]} (see `mmrl ls rewards`){_import_hint(spec.name, e)}"
                       ) from None
    params = dict(spec.params)
    sig = inspect.signature(fn)
    # Params must be named parameters: anything else would vanish into **fields unnoticed.
    named = {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY or
             (p.kind is p.POSITIONAL_OR_KEYWORD and n not in ("completions", "solution"))}
    unknown = sorted(set(params) - named)
    if unknown:
        raise TypeError(f"reward {spec.name!r}: unknown param(s) {unknown}; it takes "
                        f"{sorted(named) or 'none'}")
    return functools.partial(fn, **params) if params else fn


def _import_hint(name: str, error: KeyError) -> str:
    """Why a "module:fn" reward beside the config may not import: the `mmrl` command (a console
    script) does not put the current folder on Python's path, as `python -m` would."""
    cause, top = error.__cause__, name.partition(":")[0].split(".")[0]
    if not (isinstance(cause, ModuleNotFoundError) and cause.name == top):
        return ""  # no "module:fn", or the module itself failed inside: its message says why
    here = Path.cwd()
    if not any(Path(p or ".").resolve() == here for p in sys.path):
        holds = f", which holds {top}.py," if (here / f"{top}.py").is_file() else ""
        return (f"; the current folder {here}{holds} is not on Python's import path: run "
                f"`PYTHONPATH=. mmrl train ...`, or put the folder that holds {top}.py on "
                f"PYTHONPATH")
    return (f"; the current folder {here} is on the import path but holds no {top}.py: run "
            f"from the folder that holds it, or add that folder to PYTHONPATH")


class RewardSet:
    def __init__(self, specs: list[RewardSpec]):
        if not specs:
            raise ValueError("config has no rewards: add e.g. rewards: [{name: accuracy}]")
        self.specs = list(specs)
        # Same reward twice (different params) gets a positional suffix to keep metrics apart.
        self.keys = reward_keys([s.name for s in specs])
        self.fns = [bind_reward(s) for s in specs]
        self._counts = {k: [0, 0] for k in self.keys}  # this step: [scored, routed]
        # Each failing reward warns once per run (rewards/core.py keeps no module state); only
        # rewards taking **fields can receive the set (a custom one may have a fixed signature).
        self.warned: set[str] = set()
        self.options = [{"warned": self.warned} if _takes_any_keyword(fn) else {}
                        for fn in self.fns]

    def score(self, samples: list[Sample], completions: list[str],
              extra: dict[str, list] | None = None) -> tuple[list[float], dict[str, list]]:
        """-> (weighted totals [N], {reward key: [N] scores with None = not applicable})."""
        fields = _field_lists(samples, extra or {})
        solutions = [s.solution for s in samples]
        per_reward: dict[str, list] = {}
        totals = [0.0] * len(samples)
        for key, spec, fn, options in zip(self.keys, self.specs, self.fns, self.options):
            rows = [i for i, s in enumerate(samples) if spec.tasks is None or s.task in spec.tasks]
            scores: list[Any] = [None] * len(samples)
            if rows:
                sub = _call(key, fn, [samples[i] for i in rows], [completions[i] for i in rows],
                            {k: [v[i] for i in rows] for k, v in fields.items()}, options)
                for i, v in zip(rows, sub):
                    scores[i] = None if v is None else _number(v, key, samples[i])
            per_reward[key] = scores
            self._counts[key][0] += sum(scores[i] is not None for i in rows)
            self._counts[key][1] += len(rows)
            for i, v in enumerate(scores):
                if v is not None:
                    totals[i] += spec.weight * v
        return totals, per_reward

    def step_metrics(self) -> dict[str, float]:
        """`reward/<key>/scored_frac` over every score() call since the last step; resets."""
        out = {f"reward/{key}/scored_frac": scored / routed
               for key, (scored, routed) in self._counts.items() if routed}
        self._counts = {k: [0, 0] for k in self.keys}
        return out


def _call(key: str, fn, samples: list[Sample], completions: list[str], fields: dict,
          options: dict) -> list:
    """One reward over the samples routed to it -> its scores (rewards.calls names a failure:
    the reward, the sample's id and file:line; `rewards_at` adds the step)."""
    return call_reward(fn, key, completions, [s.solution for s in samples], fields,
                       [f"{s.id} ({s.source})" for s in samples], options)


def _takes_any_keyword(fn) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


@contextmanager
def rewards_at(where: str):
    """Inside: a RewardError says where it happened too ("step 12", "evaluation")."""
    try:
        yield
    except RewardError as e:
        raise RewardError(f"{where}: {e}") from e.__cause__


def _number(value: Any, key: str, sample: Sample) -> float:
    """A reward's score as a float; a string, NaN or inf stops the run before the advantages
    (a NaN there would reach the optimizer), naming the reward and the sample."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real) and not (
            hasattr(value, "item") and getattr(value, "ndim", 0) == 0):
        raise RewardError(f"reward {key!r} returned {value!r} ({type(value).__name__}) for sample "
                          f"{sample.id} ({sample.source}); a reward must return numbers or None")
    number = float(value)
    if not math.isfinite(number):
        raise RewardError(f"reward {key!r} returned {number} for sample {sample.id} "
                          f"({sample.source}); return a finite number, or None for 'not "
                          f"applicable'")
    return number


class Scorer:
    """The scoring part of a step: rewards for a rollout, then advantages over the global batch
    (every rank's scores, so batch-level whitening sees them all)."""
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("keys", "score", "advantages", "kl_in_reward", "step_metrics")

    def __init__(self, cfg: RunConfig, info: dist.DistInfo):
        self.rewards = RewardSet(cfg.rewards)
        self.keys = self.rewards.keys
        self.algo, self.max_new_tokens, self.info = cfg.algo, cfg.rollout.max_new_tokens, info
        self.all_zero = False  # the last advantages() gave every row 0: the update learns nothing

    def score(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, list]]:
        """-> (weighted totals [N], {reward key: [N] scores, None = not applicable})."""
        lengths = batch.policy_mask.sum(1).tolist()  # the model's tokens (not observations)
        extra = {"completion_length": lengths, "group_id": batch.group_ids.tolist(),
                 "max_completion_length": [self.max_new_tokens] * batch.n}
        if batch.trajectories is not None:  # calls (tool_use reads them), the env's info
            extra.update(trajectory_fields(batch.trajectories))
        else:  # single-turn: an environment that said nothing
            extra["info"] = [{} for _ in range(batch.n)]
        totals, per = self.rewards.score([p.sample for p in batch.prompts], batch.texts, extra)
        return torch.tensor(totals, dtype=torch.float32), per

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
        """Advantages over the global batch (all ranks' scores), returned for the local rows."""
        ac = self.algo
        all_scores, start = dist.gather_cat(scores, self.info)
        all_groups, _ = dist.gather_cat(group_ids, self.info)
        all_lengths, _ = dist.gather_cat(lengths, self.info)
        # algo.reward_offset: e.g. 0/1 accuracy at weight 2 with offset -1 gives NSR/PSR's +-1.
        adv = algos.compute_advantages(ac.advantage, all_scores + ac.reward_offset, all_groups,
                                       lengths=all_lengths, scale=ac.scale_rewards)
        adv = algos.weight_by_sign(adv, ac.pos_weight, ac.neg_weight)
        self.all_zero = not bool(adv.any())
        return adv[start:start + scores.numel()]

    def step_metrics(self) -> dict[str, float]:
        """The rewards' step metrics (RewardSet.step_metrics) and `adv/all_zero` (1.0 when every
        advantage of the step was 0, over all ranks)."""
        return {**self.rewards.step_metrics(), "adv/all_zero": float(self.all_zero)}

    def kl_in_reward(self, sb: ScoredBatch, state: dict, metrics: dict) -> torch.Tensor:
        """Scores minus coef * sum_t KL_t (verl use_kl_in_reward); the coefficient is fixed or
        adapted toward algo.kl_reward_target and carried through checkpoints (in `state`, the
        trainer's saved extra state)."""
        ac = self.algo
        ctl = algos.KLController(state.get("kl_reward_coef", ac.kl_reward_coef),
                                 ac.kl_reward_target, ac.kl_reward_horizon)
        scores, kl = algos.kl_in_reward(sb.scores, sb.old_logp, sb.ref_logp,
                                        sb.rollout.policy_mask, ctl.coef, ac.kl_reward_kind,
                                        ac.kl_clamp)
        kl = float(dist.all_sum(kl, self.info)) / self.info.world
        metrics.update({"kl_reward/kl": kl, "kl_reward/coef": ctl.coef})
        state["kl_reward_coef"] = ctl.update(kl, sb.rollout.n * self.info.world)
        return scores


def trajectory_fields(trajectories) -> dict[str, list]:
    """What rewards read of multi-turn rows: `calls` (each row's tool calls as dicts) and `info`
    (the environment's Step.info merged over the trajectory, a dict per row)."""
    return {"calls": call_fields(trajectories), "info": [dict(t.info) for t in trajectories]}


def _field_lists(samples: list[Sample], extra: dict[str, list]) -> dict[str, list]:
    keys: list[str] = []
    for s in samples:
        keys.extend(k for k in s.fields if k not in keys)
    fields = {k: [s.fields.get(k) for s in samples] for k in keys}
    fields["task"] = [s.task for s in samples]
    fields.update(extra)
    return fields
