"""Geometry read back out of free text: boxes and time segments in model answers and solutions.

Completions are untrusted model output, so every parser here returns an empty result on garbage
instead of raising, and every regex is linear (no nested quantifiers) so a hostile completion
cannot stall the report.

>>> parse_boxes("<answer>[10, 20, 30, 40] and (1.5,2,3,4)</answer>")
[[10.0, 20.0, 30.0, 40.0], [1.5, 2.0, 3.0, 4.0]]
>>> parse_segment("the event happens from 2.5 to 7 seconds")
(2.5, 7.0)
>>> parse_segment("[1:05, 1:10]")
(65.0, 70.0)
"""
from __future__ import annotations

import math
import re
from typing import Any

_NUM = r"[-+]?\d+(?:\.\d+)?"
# Four comma-separated numbers, brackets optional: "[x1,y1,x2,y2]", "(x1, y1, x2, y2)",
# '{"bbox_2d": [x1, y1, x2, y2]}' and a bare "x1,y1,x2,y2" all read as one box.
_BOX = re.compile(rf"({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})")

# Times are non-negative, so "3-5" is a range, not 3 and -5. "m:ss(.f)" timestamps are accepted.
_TIME = r"(?:\d+:)?\d+(?:\.\d+)?"
_UNIT = r"\s*(?:s|sec|secs|second|seconds)?"
_SEG_BRACKET = re.compile(rf"[\[(]\s*({_TIME}){_UNIT}\s*,\s*({_TIME}){_UNIT}\s*[\])]")
_SEG_RANGE = re.compile(
    rf"({_TIME}){_UNIT}\s*(?:to|-|–|—|~|and|until|till|through)\s*({_TIME}){_UNIT}",
    re.IGNORECASE)

# Answers longer than this are truncated before parsing: a box or segment never needs more, and
# it bounds the work done on a runaway completion.
_MAX_PARSE_CHARS = 20_000


def _finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def parse_boxes(text: Any) -> list[list[float]]:
    """Every [x1, y1, x2, y2] box written in `text`, in order of appearance."""
    if not isinstance(text, str):
        return []
    boxes = []
    for m in _BOX.finditer(text[:_MAX_PARSE_CHARS]):
        box = [float(g) for g in m.groups()]
        if _finite(box):
            boxes.append(box)
    return boxes


def boxes_from_value(value: Any) -> list[list[float]]:
    """Boxes held by a solution or field value: one box, a list of boxes, or text.

    >>> boxes_from_value([[0, 0, 5, 5], [1, 1, 2, 2]])
    [[0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 2.0, 2.0]]
    >>> boxes_from_value("3")
    []
    """
    if isinstance(value, str):
        return parse_boxes(value)
    if isinstance(value, dict):  # e.g. {"bbox_2d": [...]} or {"boxes": [...]}
        return [b for v in value.values() for b in boxes_from_value(v)]
    if isinstance(value, (list, tuple)):
        if len(value) == 4 and all(_is_number(v) for v in value):
            box = [float(v) for v in value]
            return [box] if _finite(box) else []
        return [b for v in value for b in boxes_from_value(v)]
    return []


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _seconds(token: str) -> float:
    if ":" in token:
        minutes, secs = token.split(":", 1)
        return int(minutes) * 60.0 + float(secs)
    return float(token)


def parse_segment(text: Any) -> tuple[float, float] | None:
    """The first time segment (start, end) in seconds written in `text`, or None.

    Brackets win over ranges so "[2, 5]" is not read as part of a longer "1 - 2" phrase.
    """
    if not isinstance(text, str):
        return None
    text = text[:_MAX_PARSE_CHARS]
    for pattern in (_SEG_BRACKET, _SEG_RANGE):
        m = pattern.search(text)
        if m:
            a, b = _seconds(m.group(1)), _seconds(m.group(2))
            return (min(a, b), max(a, b))
    return None


def segments_from_value(value: Any) -> list[tuple[float, float]]:
    """Segments held by a solution value: [s, e], [[s, e], ...], or text.

    >>> segments_from_value([[1, 2], [4.5, 6]])
    [(1.0, 2.0), (4.5, 6.0)]
    """
    if isinstance(value, str):
        seg = parse_segment(value)
        return [seg] if seg else []
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(_is_number(v) for v in value):
            a, b = float(value[0]), float(value[1])
            return [(min(a, b), max(a, b))] if _finite([a, b]) else []
        return [s for v in value for s in segments_from_value(v)]
    return []
