"""Counting rewards: `count` (exact integer) and `count_fuzzy` (credit by relative error)."""
from __future__ import annotations

import re
from typing import Any

from rewards.core import ANSWER_CLOSE, ANSWER_OPEN, extract_answer, find_numbers, score_batch, solution_text, to_float
from rewards.registry import register

_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_WORDS.update({"no": 0, "none": 0, "thirty": 30, "forty": 40, "fifty": 50})
_WORD_RE = re.compile(r"[a-z]+")
# A think block, closed or cut off by the token limit.
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)


def parse_count(answer: str) -> float | None:
    """The one count an answer states: the whole answer, else its only distinct number (numerals
    and number words alike: "There are three cats." -> 3). An answer that states two different
    numbers is a hedge and states no count ("4 or 3" -> None), so it cannot earn credit.

    >>> parse_count("7"), parse_count("I see 5 cats, 5 in all"), parse_count("Three.")
    (7.0, 5.0, 3.0)
    >>> parse_count("many") is None, parse_count("4 or 3") is None
    (True, True)
    """
    value = to_float(answer)
    if value is not None:
        return value
    found = set(find_numbers(answer, thousands=True))
    found.update(float(_WORDS[w]) for w in _WORD_RE.findall(answer.lower()) if w in _WORDS)
    return found.pop() if len(found) == 1 else None


def count_answer(text: str) -> str:
    """The answer a count is read from: the last <answer> block; without one, the text outside
    <think> blocks, so that a count stated only while thinking is not an answer."""
    if ANSWER_OPEN in text and ANSWER_CLOSE in text:
        return extract_answer(text)
    return _THINK.sub(" ", text).strip()


def _gold_count(solution: Any) -> float | None:
    value = to_float(solution_text(solution))
    return value if value is not None and value.is_integer() else None


def _count_one(text: str, solution: Any, *, fuzzy: bool) -> float | None:
    gold = _gold_count(solution)
    if gold is None:
        return None  # not a counting question
    answer = count_answer(text)
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

    Strict on purpose: the count is read from the last <answer> block (without one, from the text
    outside <think>), and an answer naming two different numbers ("4 or 3") scores 0.

    >>> count(["<answer>3</answer>", "<answer>There are three.</answer>", "<answer>4</answer>"],
    ...       ["3", 3, "3"])
    [1.0, 1.0, 0.0]
    >>> count(["<answer>4 or 3</answer>", "<think>there are 3</think>", "3"], ["3", "3", "3"])
    [0.0, 0.0, 1.0]
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
