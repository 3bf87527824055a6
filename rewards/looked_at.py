"""Did the search look at the right place? A process score for tool use: 1.0 when a call that
succeeded read a region of the original media holding the record's target whole (a box in
original pixels, or a span in seconds), else 0.0. V*-style data carries the target's box; logged
at weight 0 it is the share of trajectories whose crops found it, which an outcome reward cannot
tell apart from a lucky guess (`sft.stop_metric: looked_at_mean` stops a warm-up on it)."""
from __future__ import annotations

from typing import Any

from rewards.registry import register


def holds(region: Any, target: Any, max_ratio: float | None = None) -> bool:
    """Whether `region` ([x1, y1, x2, y2] or [start, end]) holds `target` (same shape) whole;
    with `max_ratio`, also at most that many times the target's extent on every axis (a look
    that holds a small mark but returns it too small to read does not count).

    >>> holds([10, 10, 50, 50], [20, 20, 30, 30]), holds([10, 10, 50, 50], [5, 20, 30, 30])
    (True, False)
    >>> holds([2.0, 5.0], [3.0, 4.5]), holds([2.0, 5.0], [1.0, 4.0])
    (True, False)
    >>> holds([10, 10, 50, 50], [20, 20, 30, 30], 4), holds([0, 0, 90, 90], [20, 20, 30, 30], 4)
    (True, False)
    """
    half = len(target) // 2
    if not (len(region) == len(target) and all(region[i] <= target[i] for i in range(half))
            and all(region[i] >= target[i] for i in range(half, len(target)))):
        return False
    return max_ratio is None or all(region[i + half] - region[i]
                                    <= max_ratio * (target[i + half] - target[i])
                                    for i in range(half))


def _region_key(target: Any) -> str | None:
    if isinstance(target, (list, tuple)) and all(isinstance(v, (int, float)) for v in target):
        return {4: "box", 2: "span"}.get(len(target))
    return None


@register("looked_at")
def looked_at(completions: list, solution: list | None = None, *, calls: Any = None,
              target: str = "target_box", max_ratio: float | None = None,
              **fields: Any) -> list[float | None]:
    """1.0 when some call that succeeded read a region holding the record's `target` field
    whole: a box [x1, y1, x2, y2] in original pixels against the `box` a crop read, or a span
    [start, end] in seconds against the `span` frames / audio_clip read; else 0.0. With
    `max_ratio`, the region must also be at most that many times the target's width and height
    (or length): a crop of the whole image holds a small mark but shows it too small to read.

    Reads the per-row `calls` field mmrl passes with tools on ([{"name", "turn", "error",
    "seen"}, ...]; `seen` is what each call read, tools.base.looked_at). Rows without `calls`, or
    whose `target` field is missing or not a box or span, are not scored (None)."""
    n = len(completions)
    targets = fields.get(target)
    if not isinstance(calls, list) or len(calls) != n or not isinstance(targets, list):
        return [None] * n
    out: list[float | None] = []
    for row, goal in zip(calls, targets):
        key = _region_key(goal)
        if key is None or not isinstance(row, list):
            out.append(None)
            continue
        regions = [s[key] for c in row if isinstance(c, dict) and not c.get("error")
                   for s in c.get("seen") or [] if isinstance(s, dict) and key in s]
        out.append(1.0 if any(holds(r, goal, max_ratio) for r in regions) else 0.0)
    return out
