"""Calling a reward so that its failure names what failed.

A reward scores a batch; when it raises, its exception says nothing about which sample broke it
(`KeyError: 'difficulty'`), and a reward that returns a float or a generator fails later with a
foreign message. `call_reward` names the reward, the item (the caller's label for each sample,
e.g. "id (file:line)") and the exception's type and message.
"""
from __future__ import annotations

import inspect
import numbers
from typing import Callable


class RewardError(ValueError):
    """A reward raised, or returned something other than one number (or None) per completion;
    the message names the reward and the sample."""


def call_reward(fn: Callable, name: str, completions: list[str], solutions: list,
                fields: dict[str, list], labels: list[str], options: dict | None = None) -> list:
    """`fn(completions, solutions, **fields, **options)` -> its list of scores, one per
    completion (`fields`: per-sample lists; `options`: passed whole); a failure is a RewardError
    naming `name` and the sample by its label."""
    options = options or {}
    try:
        out = fn(completions, solutions, **fields, **options)
    except Exception as e:
        bad = _failing(fn, completions, solutions, fields, options)
        where = (f"on sample {labels[bad]}" if bad is not None else
                 f"on a batch of {len(labels)} samples, each of which scores alone (first: "
                 f"{labels[0]})")
        text = str(e) if len(str(e)) <= 300 else str(e)[:300] + "..."
        raise RewardError(f"reward {name!r} raised {type(e).__name__}: {text} {where}; fix the "
                          f"reward or the record (--debug shows the traceback)") from e
    n = len(completions)
    if isinstance(out, numbers.Number) or out is None:
        raise RewardError(f"reward {name!r} returned {out!r} ({type(out).__name__}), not a list: "
                          f"a reward scores a batch and returns one number (or None) per "
                          f"completion, {n} here (first sample {labels[0]})")
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        kind = "a generator" if inspect.isgenerator(out) else type(out).__name__
        raise RewardError(f"reward {name!r} returned {kind}, not a list of {n} scores; return a "
                          f"list (e.g. wrap it in list(...)) (first sample {labels[0]})")
    if len(out) != n:
        raise RewardError(f"reward {name!r} returned {len(out)} scores for {n} completions "
                          f"(first sample {labels[0]})")
    return list(out)


def _failing(fn: Callable, completions, solutions, fields, options) -> int | None:
    """The first sample on which the reward raises when called on it alone (rewards are pure,
    so one call per sample finds it), or None when each one scores alone."""
    for i in range(len(completions)):
        try:
            fn([completions[i]], [solutions[i]], **{k: [v[i]] for k, v in fields.items()},
               **options)
        except Exception:
            return i
    return None
