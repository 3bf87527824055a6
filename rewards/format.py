"""Rewards on the shape of a completion rather than its content: `format` and `overlong`."""
from __future__ import annotations

import math
import re
from typing import Any

from rewards.core import ANSWER_CLOSE, score_batch
from rewards.registry import register

_THINK_THEN_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


THINK_MODES = ("true", "false", "optional", "forbidden")
_ANSWER_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)


def _think_mode(think: Any) -> str:
    mode = str(think).strip().lower() if isinstance(think, str) else ("true" if think else "false")
    mode = {"1": "true", "yes": "true", "0": "false", "no": "false", "none": "false"}.get(mode, mode)
    if mode not in THINK_MODES:
        raise ValueError(f"format: think must be one of {THINK_MODES}, got {think!r}")
    return mode


def text_after_answer(text: str) -> str:
    """What a completion holds after its first closing answer tag, stripped ("" without one).

    >>> text_after_answer("<answer>C</answer>C</answer"), text_after_answer("<answer>C</answer>\\n")
    ('C</answer', '')
    """
    return text.partition(ANSWER_CLOSE)[2].strip() if ANSWER_CLOSE in text else ""


def _format_one(text: str, _solution: Any, *, think: str, text_after: bool) -> float:
    # Counting tags first rules out a second answer hidden inside the think block or after the
    # answer, and keeps the regex below from backtracking over many candidate tags.
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return 0.0
    if text_after_answer(text):
        if not text_after:
            return 0.0
        text = text[:text.index(ANSWER_CLOSE) + len(ANSWER_CLOSE)]  # the shape up to the answer
    if think == "optional" and "<think>" not in text and "</think>" not in text:
        match = _ANSWER_ONLY.fullmatch(text)
        return 1.0 if match and match.group(1).strip() else 0.0
    if think == "forbidden" and ("<think>" in text or "</think>" in text):
        return 0.0
    if think in ("true", "optional"):
        if text.count("<think>") != 1 or text.count("</think>") != 1:
            return 0.0
        match = _THINK_THEN_ANSWER.fullmatch(text)
        answer = match.group(2) if match else ""
    else:
        match = _ANSWER_BLOCK.search(text)
        answer = match.group(1) if match else ""
    # An empty answer block is not a well-formed answer: it must never earn the maximum.
    return 1.0 if answer.strip() else 0.0


@register("format")
def format_reward(completions: list, solution: list | None = None, *, think: Any = True,
                  text_after: bool = False, tasks: Any = None,
                  **fields: Any) -> list[float | None]:
    """1.0 for `<think>...</think>` then exactly one non-empty `<answer>...</answer>`, and no text
    after it (unless `text_after=true`), else 0.0.

    Default (`think=True`): the whole completion must be one think block followed by one answer
    block, with only whitespace around and between them (DOTALL; the think block may be empty).
    `think=False`: exactly one non-empty answer block; text before it is allowed (so a model that
    still thinks aloud, with or without tags, is not punished for it).
    `think="optional"`: either the think-then-answer shape or the answer block alone.
    `think="forbidden"`: like False, but any <think> tag scores 0 (no-think templates).
    In every mode, text after the closing `</answer>` scores 0 (whitespace aside): a policy that
    stops ending its answers writes on to the token limit (`<answer>C</answer>C</answer`), and
    paying it full format credit lets that drift grow. `text_after=True` allows it, in every
    mode, for a task whose completions go on after the answer on purpose.
    Does not look at the solution.

    >>> format_reward(["<think>2+2</think>\\n<answer>4</answer>", "<answer>4</answer>",
    ...                "<think>a</think><answer>4</answer><answer>5</answer>"], [None] * 3)
    [1.0, 0.0, 0.0]
    >>> format_reward(["Let me see. <answer>4</answer>", "<answer>C</answer>C</answer"], [None] * 2,
    ...               think=False)
    [1.0, 0.0]
    >>> format_reward(["<answer>C</answer> That is all."], [None], think=False, text_after=True)
    [1.0]
    >>> format_reward(["<answer>4</answer>", "<think>a</think><answer>4</answer>", "x<answer>4</answer>"],
    ...               [None] * 3, think="optional")
    [1.0, 1.0, 0.0]
    >>> format_reward(["<think>a</think><answer>4</answer>"], [None], think="forbidden")
    [0.0]
    """
    if not isinstance(text_after, bool):
        raise ValueError(f"format: text_after must be true or false, got {text_after!r}")
    return score_batch(_format_one, completions, solution, fields, tasks=tasks,
                       solution_required=False, think=_think_mode(think), text_after=text_after)


def _to_length(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _overlong_one(_text: str, _solution: Any, *, completion_length: Any,
                  max_completion_length: Any, max_length: Any, cache: Any) -> float | None:
    length = _to_length(completion_length)
    limit = _to_length(max_length if max_length is not None else max_completion_length)
    if length is None or limit is None or limit <= 0:
        return None  # without a length and a limit the penalty is not defined for this sample
    buffer = _to_length(cache) if cache is not None else 0.2 * limit
    buffer = min(max(buffer or 0.0, 0.0), limit)
    if length <= limit - buffer:
        return 0.0
    if length > limit or buffer == 0:
        return -1.0
    # Clamped: (limit - buffer) - limit rounds to -buffer * (1 + 2^-52) for some buffers.
    return max(-1.0, ((limit - buffer) - length) / buffer)


@register("overlong", low=-1.0, high=0.0)
def overlong(completions: list, solution: list | None = None, *, max_length: int | None = None,
             cache: int | None = None, tasks: Any = None, **fields: Any) -> list[float | None]:
    """DAPO soft overlong penalty: 0 up to `max_length - cache` tokens, linear to -1 at the limit.

    Needs the field `completion_length` (tokens). The limit is `max_length`, or else the field
    `max_completion_length`; `cache` (the soft buffer) defaults to 20% of the limit, DAPO's
    4096/20480. Longer than the limit scores -1. No length or no limit -> None (not applicable).

    >>> overlong(["a"] * 4, [None] * 4, completion_length=[50, 80, 90, 120],
    ...          max_length=100, cache=20)
    [0.0, 0.0, -0.5, -1.0]
    """
    return score_batch(_overlong_one, completions, solution, fields, tasks=tasks,
                       needs=("completion_length", "max_completion_length"),
                       solution_required=False, max_length=max_length, cache=cache)
