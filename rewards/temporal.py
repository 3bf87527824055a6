"""Temporal grounding: `tiou`, `tiou_v2` (Time-R1) and the R1@m / mIoU metric."""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

from rewards.core import extract_answer, score_batch, solution_text
from rewards.registry import register

Segment = tuple[float, float]

# Seconds ("12.5") or clock time ("01:05", "1:02:03.5"). Not preceded by a digit, dot or minus:
# "-3 to 5" is a negative (invalid) start, not a segment from 3.
_TIME = r"\d+(?::\d{1,2}){0,2}(?:\.\d+)?"
_UNIT = r"\s*(?i:s|sec|secs|second|seconds)?\.?"
_SEGMENT = re.compile(
    rf"(?<![\d.\-])({_TIME}){_UNIT}\s*(?i:to|-|–|—|~|,|and|until)\s*({_TIME})")
_ANY_TIME = re.compile(rf"(?<![\d.:]){_TIME}")


def _seconds(text: str) -> float:
    value = 0.0
    for part in text.split(":"):
        value = value * 60 + float(part)
    return value


def parse_segment(value: Any) -> Segment | None:
    """(start, end) in seconds from "a to b", "a-b", "[a, b]", "from 1:05 to 1:10", or a pair.

    The order is kept as written: a reversed segment is the caller's to judge. Text holding more
    than two times is not one segment ("[0,6,5,5]", "1 to 2 or 3 to 4", garbage with digits): None,
    so a policy cannot collect credit by spraying numbers.

    >>> parse_segment("The event happens from 12.5s to 20 seconds."), parse_segment("[3, 7.5]")
    ((12.5, 20.0), (3.0, 7.5))
    >>> parse_segment("01:05 - 01:10"), parse_segment("soon"), parse_segment("[0, 6, 5, 5]")
    ((65.0, 70.0), None, None)
    """
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and isinstance(value[0], (list, tuple)):
            value = value[0]
        if len(value) != 2:
            return None
        try:
            start, end = float(value[0]), float(value[1])
        except (TypeError, ValueError, OverflowError):
            return None
    elif isinstance(value, str):
        match = _SEGMENT.search(value)
        if match is None or len(_ANY_TIME.findall(value)) != 2:
            return None
        start, end = _seconds(match.group(1)), _seconds(match.group(2))
    else:
        return None
    return (start, end) if math.isfinite(start) and math.isfinite(end) else None


def segment_iou(pred: Segment, gold: Segment) -> float:
    """Intersection over union of two ordered segments (0 when the union has no length).

    >>> segment_iou((0, 10), (5, 15))
    0.3333333333333333
    """
    inter = max(0.0, min(pred[1], gold[1]) - max(pred[0], gold[0]))
    union = (pred[1] - pred[0]) + (gold[1] - gold[0]) - inter
    value = inter / union if union > 0 else 0.0
    return value if math.isfinite(value) else 0.0


def gold_segment(solution: Any) -> Segment | None:
    """The solution's segment, ordered (a swapped solution is a data accident), or None."""
    gold = parse_segment(solution if not isinstance(solution, str) else solution_text(solution))
    return (min(gold), max(gold)) if gold else None


def pred_segment(text: str) -> Segment | None:
    """The segment the tiou rewards score in a completion: its answer's, None when unparsable
    or reversed (both score 0)."""
    answer = extract_answer(text)
    pred = parse_segment(answer) if answer else None
    return pred if pred is not None and pred[0] <= pred[1] else None


def _tiou_one(text: str, solution: Any) -> float | None:
    gold = gold_segment(solution)
    if gold is None:
        return None  # not a temporal grounding sample
    pred = pred_segment(text)
    return segment_iou(pred, gold) if pred else 0.0


@register("tiou")
def tiou(completions: list, solution: list, *, tasks: Any = None,
         **fields: Any) -> list[float | None]:
    """Temporal IoU of the answer's segment with the solution segment (seconds).

    Segments: "a to b", "a-b", "[a, b]", "from 1:05 to 1:10" (seconds or clock time). A reversed
    or unparsable answer scores 0; a solution without a segment gives None.

    >>> tiou(["<answer>5 to 15</answer>", "<answer>[0, 10]</answer>", "<answer>10-0</answer>"],
    ...      [[0, 10], "0 to 10", [0, 10]])
    [0.3333333333333333, 1.0, 0.0]
    """
    return score_batch(_tiou_one, completions, solution, fields, tasks=tasks)


def _tiou_v2_one(text: str, solution: Any, *, duration: Any) -> float | None:
    gold = gold_segment(solution)
    try:
        length = float(duration)
    except (TypeError, ValueError, OverflowError):
        return None
    if gold is None or not math.isfinite(length) or length <= 0:
        return None  # no segment or no duration: tiou_v2 is not defined here
    pred = pred_segment(text)
    if pred is None:
        return 0.0
    start_factor = max(0.0, 1.0 - abs(pred[0] - gold[0]) / length)
    end_factor = max(0.0, 1.0 - abs(pred[1] - gold[1]) / length)
    return segment_iou(pred, gold) * start_factor * end_factor


@register("tiou_v2")
def tiou_v2(completions: list, solution: list, *, tasks: Any = None,
            **fields: Any) -> list[float | None]:
    """Time-R1 tIoU: tIoU * (1 - |Δstart| / duration) * (1 - |Δend| / duration).

    Each factor is floored at 0. Needs the field `duration` (seconds); without it the sample
    scores None.

    >>> tiou_v2(["<answer>5 to 15</answer>"], [[0, 10]], duration=[100])
    [0.3008333333333333]
    """
    return score_batch(_tiou_v2_one, completions, solution, fields, tasks=tasks,
                       needs=("duration",))


def temporal_grounding_metrics(predictions: Sequence[Any], solutions: Sequence[Any],
                               thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> dict[str, float]:
    """Metric: R1@m (fraction of samples with tIoU >= m) for each m, and mIoU.

    >>> temporal_grounding_metrics(["0 to 10", "5 to 15"], [[0, 10], [0, 10]])
    {'R1@0.3': 1.0, 'R1@0.5': 0.5, 'R1@0.7': 0.5, 'mIoU': 0.6666666666666666}
    """
    scores = [s for s in tiou([str(p) for p in predictions], list(solutions)) if s is not None]
    n = max(len(scores), 1)
    out = {f"R1@{m:g}": sum(s >= m for s in scores) / n for m in thresholds}
    out["mIoU"] = sum(scores) / n
    return out
