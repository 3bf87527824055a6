"""Bind the configured rewards and score completions, routing each sample to its task's rewards.

A reward sees per-sample lists of every field of the samples it scores (plus `task`,
`completion_length`, `max_completion_length`); samples whose task is not in a reward's `tasks`
get None from it. The weighted total treats None as 0, so a sample is scored only by the rewards
that apply to it.

`step_metrics()` reports, per reward, the fraction of the step's samples of its tasks that it
scored (`reward/<key>/scored_frac`). A reward that scores none of them for `SILENT_STEPS` steps
in a row trains on nothing: that is warned about once, on the progress display.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable

from rewards import get_reward

from mmrl.config import RewardSpec
from mmrl.types import Sample

SILENT_STEPS = 10


def bind_reward(spec: RewardSpec) -> Callable[..., list]:
    """Resolve a reward by name and bind its params; unknown params fail here, not mid-run."""
    try:
        fn = get_reward(spec.name)
    except KeyError as e:
        raise KeyError(f"rewards: {e.args[0]} (see `mmrl ls rewards`)") from None
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


class RewardSet:
    def __init__(self, specs: list[RewardSpec]):
        if not specs:
            raise ValueError("config has no rewards: add e.g. rewards: [{name: accuracy}]")
        self.specs = list(specs)
        names = [s.name.rsplit(":", 1)[-1] for s in specs]
        # Same reward twice (different params) gets a positional suffix to keep metrics apart.
        self.keys = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]
        self.fns = [bind_reward(s) for s in specs]
        self._counts = {k: [0, 0] for k in self.keys}  # this step: [scored, routed]
        self._silent = {k: 0 for k in self.keys}  # consecutive steps routed but never scored
        self._warned: set[str] = set()
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
                sub = fn([completions[i] for i in rows], [solutions[i] for i in rows],
                         **{k: [v[i] for i in rows] for k, v in fields.items()}, **options)
                if len(sub) != len(rows):
                    raise RuntimeError(f"reward {key!r} returned {len(sub)} scores for {len(rows)}")
                for i, v in zip(rows, sub):
                    scores[i] = None if v is None else _number(v, key, samples[i])
            per_reward[key] = scores
            self._counts[key][0] += sum(scores[i] is not None for i in rows)
            self._counts[key][1] += len(rows)
            for i, v in enumerate(scores):
                if v is not None:
                    totals[i] += spec.weight * v
        return totals, per_reward


    def step_metrics(self, warn: Callable[[str], None] | None = None) -> dict[str, float]:
        """`reward/<key>/scored_frac` over every score() call since the last step; resets."""
        out = {}
        for key, (scored, routed) in self._counts.items():
            if not routed:
                continue  # no sample of its tasks this step: nothing to say
            out[f"reward/{key}/scored_frac"] = scored / routed
            self._silent[key] = self._silent[key] + 1 if scored == 0 else 0
            if self._silent[key] >= SILENT_STEPS and key not in self._warned and warn is not None:
                self._warned.add(key)
                warn(f"reward {key!r} scored none of its samples for {self._silent[key]} steps "
                     f"(it returns None: check the fields it needs with `mmrl data inspect FILE "
                     f"--config CONFIG`)")
        self._counts = {k: [0, 0] for k in self.keys}
        return out
def _takes_any_keyword(fn) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


class RewardError(ValueError):
    """A reward returned something that is not a finite number (or None)."""


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


def _field_lists(samples: list[Sample], extra: dict[str, list]) -> dict[str, list]:
    keys: list[str] = []
    for s in samples:
        keys.extend(k for k in s.fields if k not in keys)
    fields = {k: [s.fields.get(k) for s in samples] for k in keys}
    fields["task"] = [s.task for s in samples]
    fields.update(extra)
    return fields
