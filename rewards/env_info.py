"""Rewards read from an environment's `info` (mmrl/envs/base.py: each trajectory's info dict,
passed as the `info` field): what the world says happened, not what the text claims. The
grid_nav environment writes `success` (1.0 at the goal) and `progress` (the share of the way
covered); a user environment names its own keys (`key`)."""
from __future__ import annotations

from typing import Any

from rewards.registry import register


def info_values(n: int, info: Any, key: str) -> list[float | None]:
    """Each row's `info[key]` as a float (bools count: True -> 1.0); 0.0 where the row's info
    lacks the key (the environment never said so: e.g. a turn cut at the token limit ends the
    trajectory before any step), None where the row has no info dict (no environment) or the
    value is not a number.

    >>> info_values(4, [{"success": 1.0}, {"success": False}, {}, {"success": "yes"}], "success")
    [1.0, 0.0, 0.0, None]
    >>> info_values(2, None, "success")
    [None, None]
    """
    if not isinstance(info, list) or len(info) != n:
        return [None] * n
    out: list[float | None] = []
    for row in info:
        value = row.get(key, 0.0) if isinstance(row, dict) else None
        out.append(float(value) if isinstance(value, (int, float)) else None)
    return out


@register("success")
def success(completions: list, solution: list | None = None, *, info: Any = None,
            key: str = "success", **fields: Any) -> list[float | None]:
    """The environment's verdict: info[`key`] (1.0 when the trajectory succeeded, e.g. grid_nav
    reached its goal); 0.0 where the info lacks it, None for a row without info (no environment)."""
    return info_values(len(completions), info, key)


@register("progress")
def progress(completions: list, solution: list | None = None, *, info: Any = None,
             key: str = "progress", **fields: Any) -> list[float | None]:
    """Partial credit from the environment: info[`key`] in [0, 1] (grid_nav: the share of the
    start's distance to the goal covered at best), a denser signal than success alone."""
    return info_values(len(completions), info, key)
