"""What the rewards read in a rollout, read by the rewards' own parsers: the answer
(`rewards.extract_answer`), boxes (`rewards.boxes`, mapped into the solution's pixels as the
run's box reward's `coords` says) and time segments (`rewards.temporal`). So a drawn box or
segment is the one that was scored, and an answer the rewards could not read shows as nothing.

>>> predicted_boxes({"completion": "<answer>[0, 0, 500, 500]</answer>",
...                  "fields": {"image_size": [320, 240]}}, BoxRule(coords="norm1000"))
[(0.0, 0.0, 160.0, 120.0)]
>>> gold_boxes("<answer>[10, 20, 30, 40]</answer>"), gold_boxes("3")
([(10.0, 20.0, 30.0, 40.0)], [])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewards import extract_answer
from rewards.boxes import (QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, Box, check_coords, ordered,
                           parse_box, parse_boxes, pixel_scale, scale_box)
from rewards.core import solution_text
from rewards.temporal import gold_segment, pred_segment  # noqa: F401 (the report's segments)

# Box rewards that score the answer's first box, and those that score every box in it.
ONE_BOX, EVERY_BOX = ("iou", "giou"), ("detection",)


@dataclass(frozen=True)
class BoxRule:
    """How the run's box reward reads a predicted box (its params in config.yaml)."""
    every_box: bool = False
    coords: str = "absolute"
    min_pixels: int = QWEN_MIN_PIXELS
    max_pixels: int = QWEN_MAX_PIXELS


def box_rule(config: dict) -> BoxRule:
    """The first box reward of a run's config (`rewards:` in config.yaml); absolute pixels and
    one box when the run scored none (a report of a run dir without its config still draws)."""
    for spec in config.get("rewards") or []:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name in ONE_BOX + EVERY_BOX:
            params = spec.get("params") or {}
            try:
                return BoxRule(name in EVERY_BOX, check_coords(params.get("coords", "absolute")),
                               int(params.get("min_pixels", QWEN_MIN_PIXELS)),
                               int(params.get("max_pixels", QWEN_MAX_PIXELS)))
            except (TypeError, ValueError):  # a hand-edited config: draw in pixels, never fail
                return BoxRule(name in EVERY_BOX)
    return BoxRule()


def answer_text(record: dict) -> str:
    """The answer every reward reads in the completion ("" when none could be read: an
    answer cut at the token budget, a tag that never closes)."""
    return extract_answer(record.get("completion") or "")


def gold_boxes(solution: Any) -> list[Box]:
    """The solution's boxes (a box, a list of boxes or labelled boxes, or text), corners sorted."""
    value = solution_text(solution) if isinstance(solution, str) else solution
    return [ordered(box) for box, _ in parse_boxes(value) if box is not None]


def predicted_boxes(record: dict, rule: BoxRule) -> list[Box]:
    """The completion's boxes in the solution's pixels, as the box reward scored them; none
    where its `coords` need an image size the record lacks (the reward scored None too)."""
    answer = answer_text(record)
    if rule.every_box:
        boxes = [box for box, _ in parse_boxes(answer) if box is not None]
    else:
        boxes = [box for box in [parse_box(answer) if answer else None] if box is not None]
    fields = record.get("fields") if isinstance(record.get("fields"), dict) else {}
    scale = pixel_scale(rule.coords, fields.get("image_size"), fields.get("resized_size"),
                        rule.min_pixels, rule.max_pixels)
    return [scale_box(box, scale) for box in boxes] if scale else []
