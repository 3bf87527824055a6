"""Order rewards for jigsaw-style tasks: the answer is a permutation written as integers."""
from __future__ import annotations

import re
from typing import Any

from rewards.core import extract_answer, score_batch, solution_text
from rewards.registry import register

_INT = re.compile(r"-?\d+")


def parse_order(text: Any) -> list[int]:
    """The integers of an answer in order ("2, 1, 4, 3" / "[2,1,4,3]" / "2 1 4 3" -> [2, 1, 4, 3]).

    >>> parse_order("[2, 1,4 3]"), parse_order("none"), parse_order([2, "1", 3.0]), parse_order(["cat"])
    ([2, 1, 4, 3], [], [2, 1, 3], [])
    """
    if isinstance(text, (list, tuple)):  # a solution column: integers (or their strings) only
        out = []
        for x in text:
            if isinstance(x, bool) or not isinstance(x, (int, float, str)):
                return []
            s = str(int(x)) if isinstance(x, float) and x.is_integer() else str(x).strip()
            if not _INT.fullmatch(s):
                return []
            out.append(_int(s))
        return out
    return [_int(x) for x in _INT.findall(str(text))]


def _int(digits: str) -> int:
    # A position never has 13 digits; -1 (never a valid position) keeps huge garbage linear-time.
    return int(digits) if len(digits) <= 12 else -1


def _order_one(text: str, solution: Any, *, partial: bool) -> float | None:
    gold = parse_order(solution if isinstance(solution, (list, tuple)) else solution_text(solution))
    if not gold:
        return None  # not an ordering task
    pred = parse_order(extract_answer(text))
    if len(pred) != len(gold):
        return 0.0
    if not partial:
        return 1.0 if pred == gold else 0.0
    return sum(p == g for p, g in zip(pred, gold)) / len(gold)


@register("order")
def order(completions: list, solution: list, *, partial: bool = False, tasks: Any = None,
          **fields: Any) -> list[float | None]:
    """1.0 when the answer's integers equal the solution's order (a list or "2,1,4,3"), else 0.0;
    `partial=True` gives the share of positions right (wrong length: 0.0).

    >>> order(["<answer>2,1,4,3</answer>", "<answer>2 1 3 4</answer>", "<answer>1</answer>"],
    ...       [[2, 1, 4, 3], "2,1,4,3", "2,1,4,3"])
    [1.0, 0.0, 0.0]
    >>> order(["<answer>2 1 3 4</answer>"], ["2,1,4,3"], partial=True)
    [0.5]
    """
    return score_batch(_order_one, completions, solution, fields, tasks=tasks, partial=bool(partial))
