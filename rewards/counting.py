"""Counting rewards: `count` (exact integer) and `count_fuzzy` (credit by relative error)."""
from __future__ import annotations

import re
from typing import Any

from rewards.core import extract_answer, find_numbers, score_batch, solution_text, to_float
from rewards.registry import register

_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_WORDS.update({"no": 0, "none": 0, "thirty": 30, "forty": 40, "fifty": 50})
_WORD_RE = re.compile(r"[a-z]+")


def parse_count(answer: str) -> float | None:
    """The count an answer states: the whole answer, else its last numeral, else its last number
    word ("There are three cats." -> 3).

    >>> parse_count("7"), parse_count("I see 2 dogs and 5 cats"), parse_count("Three.")
    (7.0, 5.0, 3.0)
    >>> parse_count("many") is None
    True
    """
    value = to_float(answer)
    if value is not None:
        return value
    numbers = find_numbers(answer, thousands=True)
    if numbers:
        return numbers[-1]
    words = [_WORDS[w] for w in _WORD_RE.findall(answer.lower()) if w in _WORDS]
    return float(words[-1]) if words else None


def _gold_count(solution: Any) -> float | None:
    value = to_float(solution_text(solution))
    return value if value is not None and value.is_integer() else None


def _count_one(text: str, solution: Any, *, fuzzy: bool) -> float | None:
    gold = _gold_count(solution)
    if gold is None:
        return None  # not a counting question
    answer = extract_answer(text)
    pred = parse_count(answer) if answer else None
    if pred is None:
        return 0.0
    if not fuzzy:
        return 1.0 if pred == gold else 0.0
    return max(0.0, 1.0 - abs(pred - gold) / max(gold, 1.0))


@register("count")
def count(completions: list, solution: list, *, tasks: Any = None,
          **fields: Any) -> list[float | None]:
    """1.0 when the stated count equals the integer solution, else 0.0 (non-integer solution: None).

    >>> count(["<answer>3</answer>", "<answer>There are three.</answer>", "<answer>4</answer>"],
    ...       ["3", 3, "3"])
    [1.0, 1.0, 0.0]
    """
    return score_batch(_count_one, completions, solution, fields, tasks=tasks, fuzzy=False)


@register("count_fuzzy")
def count_fuzzy(completions: list, solution: list, *, tasks: Any = None,
                **fields: Any) -> list[float | None]:
    """Partial credit for counts: max(0, 1 - |pred - gt| / max(gt, 1)).

    >>> count_fuzzy(["<answer>3</answer>", "<answer>5</answer>", "<answer>12</answer>"],
    ...             ["4", "4", "4"])
    [0.75, 0.75, 0.0]
    """
    return score_batch(_count_one, completions, solution, fields, tasks=tasks, fuzzy=True)
