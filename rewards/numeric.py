"""Numeric answers: `mra` (VSI-Bench mean relative accuracy) and its metric."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rewards.core import answer_number, extract_answer, score_batch, solution_text, to_float
from rewards.registry import register

# Exactly VSI-Bench's confidence thresholds: np.linspace(0.5, 0.95, 10), compared with "<=".
MRA_THRESHOLDS = tuple(float(t) for t in np.linspace(0.50, 0.95, 10))


def relative_accuracy(pred: float, target: float) -> float:
    """Mean over thresholds t of [|pred - target| / |target| <= 1 - t]; target 0 needs pred 0.

    >>> relative_accuracy(9.0, 10.0), relative_accuracy(7.0, 10.0), relative_accuracy(0.0, 0.0)
    (0.9, 0.5, 1.0)
    """
    if target == 0:
        return 1.0 if pred == 0 else 0.0
    error = abs(pred - target) / abs(target)
    return sum(error <= 1 - t for t in MRA_THRESHOLDS) / len(MRA_THRESHOLDS)


def _mra_one(text: str, solution: Any) -> float | None:
    target = to_float(solution_text(solution))
    if target is None:
        return None  # a non-numeric question (e.g. VSI-Bench multiple choice) is not MRA's
    answer = extract_answer(text)
    pred = answer_number(answer) if answer else None
    return 0.0 if pred is None else relative_accuracy(pred, target)


@register("mra")
def mra(completions: list, solution: list, *, tasks: Any = None,
        **fields: Any) -> list[float | None]:
    """VSI-Bench mean relative accuracy of the answer's number, thresholds 0.50, 0.55, ..., 0.95.

    The answer's number is the whole answer if numeric, else its last number. A non-numeric
    solution gives None (not applicable), so MRA can share a batch with multiple-choice questions.

    >>> mra(["<answer>9</answer>", "<answer>about 12.5 m</answer>", "<answer>B</answer>"],
    ...     ["10", "10", "A"])
    [0.9, 0.6, None]
    """
    return score_batch(_mra_one, completions, solution, fields, tasks=tasks)


def mean_relative_accuracy(preds: Sequence[Any], targets: Sequence[Any]) -> float:
    """Metric: mean MRA over a dataset of answers (strings or numbers) and numeric targets.

    >>> mean_relative_accuracy(["9", "10"], [10, 10])
    0.95
    """
    scores = [s for s in mra([str(p) for p in preds], list(targets)) if s is not None]
    return sum(scores) / len(scores) if scores else 0.0
