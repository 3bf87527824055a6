"""Boxes: parsing them out of model text, coordinate conventions, and IoU / GIoU geometry.

A box is a tuple (x1, y1, x2, y2) of finite floats, top-left then bottom-right. Geometry follows
torchvision.ops (box_iou, generalized_box_iou) operation for operation, so that the scores are
equal to it on valid boxes, and returns finite numbers where torchvision would give NaN.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from rewards.core import NOT_JSON, load_json, normalize_text

Box = tuple[float, float, float, float]
Labeled = tuple[Optional[Box], Optional[str]]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# "[x1, y1, x2, y2]" or "(x1, y1, x2, y2)"
_BOX_BRACKET = re.compile(
    rf"[\[\(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\]\)]")
# Qwen2-VL's "(x1,y1),(x2,y2)", as between <|box_start|> and <|box_end|>
_BOX_POINTS = re.compile(
    rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*,?\s*(?:to)?\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_NUM_RE = re.compile(_NUM)
_OBJECT = re.compile(r"\{[^{}]*\}")
_LABEL = re.compile(r"[\"'](?:label|category|class|name)[\"']\s*:\s*[\"']([^\"']*)[\"']")
# "Position" (with "Confidence") is Visual-RFT's detection answer format.
_BOX_KEYS = ("bbox_2d", "bbox", "box", "box_2d", "Position", "position")
_LABEL_KEYS = ("label", "category", "class", "name")

# Coordinate conventions of a predicted box. The solution box is always in pixels of the original
# image; the prediction is mapped into that space before IoU. Names are matched after lowercasing
# and dropping everything but letters and digits ("Qwen2.5-VL" -> "qwen25vl").
COORDS = {"absolute": "absolute", "abs": "absolute", "pixel": "absolute", "pixels": "absolute",
          "norm1000": "norm1000", "normalized1000": "norm1000", "qwen2vl": "norm1000",
          "norm1": "norm1", "normalized": "norm1", "relative": "norm1",
          "resized": "resized", "qwen25vl": "resized"}

# Qwen2.5-VL's image processor defaults (preprocessor_config.json).
QWEN_FACTOR, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 28, 56 * 56, 28 * 28 * 16384


def _finite_box(values: Any) -> Box | None:
    try:
        box = tuple(float(v) for v in values)
    except (TypeError, ValueError, OverflowError):
        return None
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        return None
    return box  # type: ignore[return-value]


def parse_box(value: Any) -> Box | None:
    """The first box in `value`: a 4-number list, a dict with "bbox_2d"/"bbox", or text holding
    "[x1, y1, x2, y2]", "(x1,y1),(x2,y2)", or exactly four numbers and nothing else.

    >>> parse_box('{"bbox_2d": [10, 20, 110, 220], "label": "cat"}')
    (10.0, 20.0, 110.0, 220.0)
    >>> parse_box("<|box_start|>(1,2),(3,4)<|box_end|>")
    (1.0, 2.0, 3.0, 4.0)
    """
    if isinstance(value, dict):
        for key in _BOX_KEYS:
            if key in value:
                return parse_box(value[key])
        return None
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and isinstance(value[0], (list, tuple, dict)):
            return parse_box(value[0])  # [[x1, y1, x2, y2]]
        return _finite_box(value)
    if not isinstance(value, str):
        return None
    for pattern in (_BOX_BRACKET, _BOX_POINTS):
        match = pattern.search(value)
        if match:
            return _finite_box(match.groups())
    # Bare numbers only when they are all the text holds ("10 20 110 220"): four digits picked
    # out of garbage ("[2.0, answer>[4.0, 44.0, 55.0]") are not a box.
    numbers = _NUM_RE.findall(value)
    if len(numbers) != 4 or _NUM_RE.sub("", value).strip(" ,;[]()\n\t"):
        return None
    return _finite_box(numbers)


def _label(value: Any) -> str | None:
    return normalize_text(str(value)) if value is not None else None


def _structured_boxes(value: Any) -> list[Labeled] | None:
    """Boxes from parsed JSON: a list of dicts / 4-number lists, or one of them."""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return None
    if len(value) == 4 and all(isinstance(v, (int, float)) for v in value):
        value = [value]  # a single bare box
    out: list[Labeled] = []
    for item in value:
        label = None
        if isinstance(item, dict):
            label = next((_label(item[k]) for k in _LABEL_KEYS if k in item), None)
        out.append((parse_box(item), label))
    return out


def parse_boxes(value: Any) -> list[Labeled]:
    """All (box, label) pairs; unusable boxes are kept as None so that they still count as
    predictions. Truncated JSON (generation cut off mid-list) keeps its complete objects.

    >>> parse_boxes('[{"bbox_2d": [0, 0, 10, 10], "label": "Cat"}, {"bbox_2d": [5, 5')
    [((0.0, 0.0, 10.0, 10.0), 'cat')]
    """
    if not isinstance(value, str):
        return _structured_boxes(value) or []
    text = value.strip()
    if text.startswith("```"):  # ```json fences around the list
        text = text.strip("`").removeprefix("json").strip()
    parsed = load_json(text) if text[:1] in "[{" else NOT_JSON
    if parsed is not NOT_JSON:
        structured = _structured_boxes(parsed)
        if structured is not None:
            return structured
    objects = _OBJECT.findall(text)
    if objects:
        found = []
        for obj in objects:
            box = _BOX_BRACKET.search(obj)
            label = _LABEL.search(obj)
            found.append((_finite_box(box.groups()) if box else None,
                          _label(label.group(1)) if label else None))
        return found
    return [(_finite_box(m.groups()), None) for m in _BOX_BRACKET.finditer(text)]


def parse_size(value: Any) -> tuple[float, float] | None:
    """An image size as (width, height): [w, h], (w, h), {"width": w, "height": h} or "WxH"."""
    if isinstance(value, dict):
        value = (value.get("width", value.get("w")), value.get("height", value.get("h")))
    elif isinstance(value, str):
        value = re.split(r"[x×, ]+", value.strip().strip("[]()"))
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    try:
        width, height = float(value[0]), float(value[1])
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(width) and math.isfinite(height)) or width <= 0 or height <= 0:
        return None
    return width, height


def smart_resize(height: float, width: float, factor: int = QWEN_FACTOR,
                 min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS
                 ) -> tuple[int, int] | None:
    """Qwen2-VL / Qwen2.5-VL input size (height, width): qwen-vl-utils' `smart_resize`, the rule
    the anchors' and users' media code sizes images with (one source of truth with mmrl's media
    path), never below one factor per side.

    Returns None where the library raises (aspect ratio over 200) or for a degenerate size.

    >>> smart_resize(480, 640)
    (476, 644)
    """
    # Imported here: qwen_vl_utils imports torch/torchvision, which scoring text rewards never needs.
    from qwen_vl_utils import smart_resize as qwen_smart_resize

    if not (height > 0 and width > 0) or max(height, width) / min(height, width) > 200:
        return None
    if not min_pixels <= max_pixels:
        return None
    h_bar, w_bar = qwen_smart_resize(height, width, factor=factor, min_pixels=min_pixels,
                                     max_pixels=max_pixels)
    return max(factor, int(h_bar)), max(factor, int(w_bar))


def check_coords(coords: str) -> str:
    """The canonical name of a coordinate convention; a ValueError (a config error) otherwise."""
    kind = COORDS.get(re.sub(r"[^a-z0-9]", "", str(coords).lower()))
    if kind is None:
        raise ValueError(f"coords must be one of {sorted(set(COORDS.values()))} (or an alias: "
                         f"{', '.join(sorted(COORDS))}), got {coords!r}")
    return kind


def pixel_scale(coords: str, image_size: Any, resized_size: Any, min_pixels: int,
                max_pixels: int) -> tuple[float, float] | None:
    """Per-axis factors (sx, sy) mapping a predicted box into original-image pixels.

    None when the convention needs an image size that the sample does not have.
    """
    kind = check_coords(coords)
    if kind == "absolute":
        return 1.0, 1.0
    size = parse_size(image_size)
    if size is None:
        return None
    width, height = size
    if kind == "norm1000":
        return width / 1000.0, height / 1000.0
    if kind == "norm1":
        return width, height
    resized = parse_size(resized_size)
    if resized is None:
        hw = smart_resize(height, width, min_pixels=min_pixels, max_pixels=max_pixels)
        if hw is None:
            return None
        resized = (float(hw[1]), float(hw[0]))
    return width / resized[0], height / resized[1]


def scale_box(box: Box, scale: tuple[float, float]) -> Box:
    sx, sy = scale
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def is_valid(box: Box | None) -> bool:
    """Finite, and x2 >= x1, y2 >= y1 (a reversed box is a wrong answer, not a typo to fix)."""
    return box is not None and box[2] >= box[0] and box[3] >= box[1]


def ordered(box: Box) -> Box:
    """Corners sorted; used for solutions only, where a swapped pair is a data-format accident."""
    return min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])


def _area(box: Box) -> float:
    return (box[2] - box[0]) * (box[3] - box[1])


def _iou_union(a: Box, b: Box) -> tuple[float, float]:
    # Same operations as torchvision.ops.boxes._box_inter_union, for bitwise-equal float64 results.
    width = max(min(a[2], b[2]) - max(a[0], b[0]), 0.0)
    height = max(min(a[3], b[3]) - max(a[1], b[1]), 0.0)
    inter = width * height
    union = _area(a) + _area(b) - inter
    return inter, union


def box_iou(a: Box, b: Box) -> float:
    """IoU of two valid boxes; 0.0 where torchvision would divide 0 by 0 or overflow.

    >>> box_iou((0, 0, 10, 10), (5, 0, 15, 10))
    0.3333333333333333
    """
    inter, union = _iou_union(a, b)
    iou = inter / union if union > 0 else 0.0
    return iou if math.isfinite(iou) else 0.0


def generalized_box_iou(a: Box, b: Box) -> float:
    """GIoU in [-1, 1] of two valid boxes (torchvision.ops.generalized_box_iou formula).

    >>> generalized_box_iou((0, 0, 1, 1), (2, 0, 3, 1))
    -0.3333333333333333
    """
    inter, union = _iou_union(a, b)
    iou = inter / union if union > 0 else 0.0
    hull_w = max(max(a[2], b[2]) - min(a[0], b[0]), 0.0)
    hull_h = max(max(a[3], b[3]) - min(a[1], b[1]), 0.0)
    hull = hull_w * hull_h
    if not hull > 0:
        return 0.0  # two identical points: no area anywhere
    giou = iou - (hull - union) / hull
    return min(max(giou, -1.0), 1.0) if math.isfinite(giou) else 0.0
