"""A bonus for using tools, paid only with a correct answer (DeepEyes' conditional tool reward:
R = R_acc + R_format + 1[R_acc > 0] * R_tool), so that calling tools never pays for itself and a
policy cannot farm the bonus with calls that lead nowhere."""
from __future__ import annotations

from typing import Any

from rewards.registry import get_reward, register


def successful_calls(calls: Any) -> int | None:
    """How many calls of one trajectory succeeded (no "error"); None when `calls` is not a list
    of call dicts (the field mmrl passes: [{"name", "turn", "error"}, ...]).

    >>> successful_calls([{"name": "crop", "error": None}, {"name": "", "error": "malformed"}])
    1
    >>> successful_calls("crop") is None
    True
    """
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return None
    return sum(1 for c in calls if not c.get("error"))


@register("tool_use")
def tool_use(completions: list, solution: list | None = None, *, calls: Any = None,
             correct: str = "accuracy", threshold: float = 1.0, min_calls: int = 1,
             tasks: Any = None, **fields: Any) -> list[float | None]:
    """1.0 when the answer is correct (the `correct` reward scores >= `threshold`) AND the
    trajectory made at least `min_calls` tool calls that succeeded, else 0.0. Calls that failed
    (malformed, unknown tool, bad box, timeout, ...) do not count.

    Needs the per-row `calls` field that `mmrl train` and evaluation pass when tools.use is on
    (`mmrl validate` refuses this reward without tools); rows without it, or whose `correct`
    score is None, are not scored (None). `correct` is any registered reward name or
    "pkg.mod:fn", called with the same completions, solutions and fields.
    """
    n = len(completions)
    if not isinstance(calls, list) or len(calls) != n:
        return [None] * n
    judged = get_reward(correct)(completions, solution, **fields)
    out: list[float | None] = []
    for score, row in zip(judged, calls):
        made = successful_calls(row)
        if score is None or made is None:
            out.append(None)
        else:
            out.append(1.0 if score >= threshold and made >= min_calls else 0.0)
    return out
