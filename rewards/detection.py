"""Grounding and detection rewards: `iou`, `giou`, `detection` (Hungarian matching), and mAP.

Coordinate conventions (param `coords`, for the prediction; solutions are original-image pixels):
  "absolute"  pixels of the original image (no conversion; also "abs", "pixel")
  "norm1000"  Qwen2-VL's [0, 1000) grid (also "qwen2_vl"; needs field `image_size` = [width,
              height])
  "norm1"     fractions of the image (also "normalized"; needs `image_size`)
  "resized"   pixels of Qwen2.5-VL's resized input (also "qwen2_5_vl"; needs `image_size`, and
              `resized_size` = [width, height] or else Qwen's smart_resize(min/max_pixels))
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from rewards.boxes import (QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, box_iou, check_coords,
                           generalized_box_iou, is_valid, ordered, parse_box, parse_boxes,
                           pixel_scale, scale_box)
from rewards.core import NOT_JSON, as_bool, extract_answer, load_json, score_batch, solution_text
from rewards.registry import register

_SIZE_FIELDS = ("image_size", "resized_size")
# Matching cost is cubic in the number of boxes: cap what is matched, but keep the full count in
# the denominator so that spamming boxes is still penalised.
MAX_MATCHED_BOXES = 300


def _pred_and_gold(text: str, solution: Any, coords: str, image_size: Any, resized_size: Any,
                   min_pixels: int, max_pixels: int):
    """(pred box in solution pixels or None, gold box) or None when the sample is not scorable."""
    gold = parse_box(solution if not isinstance(solution, str) else solution_text(solution))
    if gold is None:
        return None  # no box in the solution: not a grounding sample
    scale = pixel_scale(coords, image_size, resized_size, min_pixels, max_pixels)
    if scale is None:
        return None  # the convention needs an image size this sample lacks
    answer = extract_answer(text)
    pred = parse_box(answer) if answer else None
    if pred is not None:
        pred = scale_box(pred, scale)
        pred = pred if all(math.isfinite(v) for v in pred) else None
    return pred, ordered(gold)


def _iou_one(text: str, solution: Any, *, image_size: Any, resized_size: Any, coords: str,
             threshold: float | None, min_pixels: int, max_pixels: int) -> float | None:
    pair = _pred_and_gold(text, solution, coords, image_size, resized_size, min_pixels, max_pixels)
    if pair is None:
        return None
    pred, gold = pair
    iou = box_iou(pred, gold) if is_valid(pred) else 0.0
    if threshold is None:
        return iou
    return 1.0 if iou >= float(threshold) else 0.0


@register("iou")
def iou(completions: list, solution: list, *, threshold: float | None = None,
        coords: str = "absolute", min_pixels: int = QWEN_MIN_PIXELS,
        max_pixels: int = QWEN_MAX_PIXELS, tasks: Any = None, **fields: Any) -> list[float | None]:
    """IoU of the answer's box [x1, y1, x2, y2] with the solution box; `threshold` makes it 1/0.

    The first box in the answer counts. Unparsable, reversed (x2 < x1) or empty answers score 0;
    a solution without a box, or a `coords` convention whose image size is missing, gives None.
    Equal to torchvision.ops.box_iou on valid boxes. See the module doc for `coords`.

    >>> iou(["<answer>[0, 0, 10, 10]</answer>", "<answer>[5, 0, 15, 10]</answer>"],
    ...     [[0, 0, 10, 10], [0, 0, 10, 10]])
    [1.0, 0.3333333333333333]
    >>> iou(["<answer>[0, 0, 500, 500]</answer>"], [[0, 0, 320, 240]], coords="norm1000",
    ...     image_size=[[640, 480]], threshold=0.5)
    [1.0]
    """
    return score_batch(_iou_one, completions, solution, fields, tasks=tasks, needs=_SIZE_FIELDS,
                       coords=check_coords(coords), threshold=threshold,
                       min_pixels=int(min_pixels), max_pixels=int(max_pixels))


def _giou_one(text: str, solution: Any, *, image_size: Any, resized_size: Any, coords: str,
              min_pixels: int, max_pixels: int) -> float | None:
    pair = _pred_and_gold(text, solution, coords, image_size, resized_size, min_pixels, max_pixels)
    if pair is None:
        return None
    pred, gold = pair
    return generalized_box_iou(pred, gold) if is_valid(pred) else 0.0


@register("giou", low=-1.0, high=1.0)
def giou(completions: list, solution: list, *, coords: str = "absolute",
         min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS, tasks: Any = None,
         **fields: Any) -> list[float | None]:
    """Generalized IoU in [-1, 1] of the answer's box with the solution box (same parsing as `iou`).

    Equal to torchvision.ops.generalized_box_iou on valid boxes. An empty, unparsable or reversed
    answer scores 0.0, like a box just touching the target; weight `format` if that is too kind.

    >>> giou(["<answer>[0, 0, 1, 1]</answer>", "<answer>[2, 0, 3, 1]</answer>"],
    ...      [[0, 0, 1, 1], [0, 0, 1, 1]])
    [1.0, -0.3333333333333333]
    """
    return score_batch(_giou_one, completions, solution, fields, tasks=tasks, needs=_SIZE_FIELDS,
                       coords=check_coords(coords), min_pixels=int(min_pixels),
                       max_pixels=int(max_pixels))


def iou_matrix(preds: Sequence[Any], golds: Sequence[Any]) -> np.ndarray:
    """Pairwise IoU [n_pred, n_gold]; rows of unusable predictions (None, reversed) are 0."""
    out = np.zeros((len(preds), len(golds)))
    for i, pred in enumerate(preds):
        if is_valid(pred):
            for j, gold in enumerate(golds):
                out[i, j] = box_iou(pred, gold)
    return out


def match_boxes(ious: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """Optimal one-to-one matching (Hungarian) maximising the summed IoU of pairs >= threshold."""
    from scipy.optimize import linear_sum_assignment

    if ious.size == 0:
        return []
    gains = np.where(ious >= threshold, ious, 0.0)
    rows, cols = linear_sum_assignment(gains, maximize=True)
    return [(int(r), int(c), float(gains[r, c])) for r, c in zip(rows, cols) if gains[r, c] > 0]


def _is_empty_list(text: str) -> bool:
    parsed = load_json(extract_answer(text).strip("`").removeprefix("json").strip())
    return parsed is not NOT_JSON and isinstance(parsed, list) and not parsed


def _detection_one(text: str, solution: Any, *, image_size: Any, resized_size: Any, coords: str,
                   threshold: float, use_labels: bool, min_pixels: int,
                   max_pixels: int) -> float | None:
    gold = parse_boxes(solution if not isinstance(solution, str) else solution_text(solution))
    gold = [(ordered(b), label) for b, label in gold if b is not None]
    if not gold and not _is_empty_list(solution if isinstance(solution, str) else str(solution)):
        return None  # no boxes and not an explicit "no objects": not a detection sample
    scale = pixel_scale(coords, image_size, resized_size, min_pixels, max_pixels)
    if scale is None:
        return None
    answer = extract_answer(text)
    if not answer:
        return 0.0
    preds = [(scale_box(b, scale) if b is not None else None, label)
             for b, label in parse_boxes(answer)]
    if not preds or not gold:
        # Nothing to find: only an explicit empty list ("[]") is right.
        return 1.0 if not preds and not gold and _is_empty_list(answer) else 0.0
    kept = preds[:MAX_MATCHED_BOXES]
    ious = iou_matrix([b for b, _ in kept], [b for b, _ in gold])
    if use_labels:  # a labelled ground truth needs the same label (a missing one is wrong too)
        for i, (_, p_label) in enumerate(kept):
            for j, (_, g_label) in enumerate(gold):
                if g_label is not None and p_label != g_label:
                    ious[i, j] = 0.0
    matched = match_boxes(ious, float(threshold))
    return sum(score for _, _, score in matched) / max(len(preds), len(gold))


@register("detection")
def detection(completions: list, solution: list, *, threshold: float = 0.5,
              use_labels: bool = True, coords: str = "absolute",
              min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS,
              tasks: Any = None, **fields: Any) -> list[float | None]:
    """Many boxes vs many: sum of Hungarian-matched IoU >= threshold / max(n_pred, n_gt).

    Matching is one-to-one and optimal (scipy linear_sum_assignment). Boxes come from a JSON
    list (`[{"bbox_2d": [...], "label": "cat"}, ...]` or bare 4-number lists); truncated JSON
    keeps its complete objects; unusable boxes still count in n_pred. With `use_labels`, a
    labelled ground truth matches only a prediction with the same (normalised) label. An image
    with no objects is answered by `[]`.

    >>> detection(['<answer>[{"bbox_2d": [0, 0, 10, 10], "label": "cat"}, '
    ...            '{"bbox_2d": [50, 50, 60, 60], "label": "dog"}]</answer>'],
    ...           [[{"bbox_2d": [0, 0, 10, 10], "label": "cat"}]])
    [0.5]
    """
    return score_batch(_detection_one, completions, solution, fields, tasks=tasks,
                       needs=_SIZE_FIELDS, threshold=float(threshold),
                       use_labels=as_bool(use_labels), coords=check_coords(coords),
                       min_pixels=int(min_pixels), max_pixels=int(max_pixels))


def _by_label(items: list[tuple]) -> dict[str | None, list[tuple]]:
    groups: dict[str | None, list[tuple]] = {}
    for item in items:
        groups.setdefault(item[1], []).append(item)
    return groups


def _image_matches(dets: list[tuple], gts: list[tuple], iou_threshold: float,
                   max_dets: int) -> list[tuple[float, bool]]:
    """COCOeval.evaluateImg for one image and class: greedy by score, each detection takes the
    unmatched ground truth of highest IoU >= threshold (ties: the later one, as COCO)."""
    dets = sorted(dets, key=lambda d: -d[2])[:max_dets]  # Python's sort is stable, like mergesort
    taken = [False] * len(gts)
    out = []
    for box, _, score in dets:
        best, best_iou = -1, min(iou_threshold, 1 - 1e-10)
        for j, (gt_box, _) in enumerate(gts):
            value = box_iou(box, gt_box) if is_valid(box) else 0.0
            if not taken[j] and value >= best_iou:
                best, best_iou = j, value
        if best >= 0:
            taken[best] = True
        out.append((score, best >= 0))
    return out


def _average_precision(matches: list[tuple[float, bool]], n_gt: int) -> float:
    """COCO 101-point interpolated AP from (score, is_true_positive) over all images."""
    order = sorted(range(len(matches)), key=lambda i: -matches[i][0])
    tp = np.cumsum([matches[i][1] for i in order], dtype=float)
    fp = np.cumsum([not matches[i][1] for i in order], dtype=float)
    recall = tp / n_gt
    precision = tp / (tp + fp + np.spacing(1))
    precision = np.maximum.accumulate(precision[::-1])[::-1]  # make precision non-increasing
    idx = np.searchsorted(recall, np.linspace(0.0, 1.0, 101), side="left")
    interpolated = np.zeros(101)
    reached = idx < len(precision)  # recall levels never reached keep precision 0
    interpolated[reached] = precision[idx[reached]]
    return float(interpolated.mean())


def mean_average_precision(predictions: Sequence[Any], ground_truths: Sequence[Any],
                           iou_threshold: float = 0.5, max_dets: int = 100) -> float:
    """Metric: COCO-style mAP@`iou_threshold` (101-point interpolation, mean over classes with
    ground truth; no area ranges, no crowd boxes), as pycocotools' AP50 for `iou_threshold=0.5`.

    `predictions[i]` is a completion string (boxes parsed as in `detection`, score 1.0) or a list
    of {"bbox": [...], "label": ..., "score": ...}; `ground_truths[i]` a list of boxes/dicts.

    >>> round(mean_average_precision(['[{"bbox": [0, 0, 10, 10], "label": "cat"}]'],
    ...                              [[{"bbox": [0, 0, 10, 10], "label": "cat"}]]), 6)
    1.0
    """
    per_class: dict[str | None, list[tuple[float, bool]]] = {}
    n_gt: dict[str | None, int] = {}
    for pred, gt in zip(predictions, ground_truths):
        if isinstance(pred, str):
            pred = extract_answer(pred)
        dets = [(b, label, _score(item)) for item, (b, label)
                in zip(_items(pred), parse_boxes(pred)) if b is not None]
        gts = [(ordered(b), label) for b, label in parse_boxes(gt) if b is not None]
        if all(label is None for _, label in gts):  # class-agnostic ground truth
            dets = [(b, None, score) for b, _, score in dets]
        det_groups, gt_groups = _by_label(dets), _by_label(gts)
        for label in set(det_groups) | set(gt_groups):
            class_gts = gt_groups.get(label, [])
            n_gt[label] = n_gt.get(label, 0) + len(class_gts)
            per_class.setdefault(label, []).extend(
                _image_matches(det_groups.get(label, []), class_gts, iou_threshold, max_dets))
    aps = [_average_precision(per_class[label], n) for label, n in n_gt.items() if n > 0]
    return float(np.mean(aps)) if aps else 0.0


def _items(pred: Any) -> list[Any]:
    """The raw items of a prediction, aligned with parse_boxes(pred), to read their scores."""
    if isinstance(pred, str):
        return [None] * len(parse_boxes(pred))
    if isinstance(pred, dict):
        return [pred]
    if isinstance(pred, list) and len(pred) == 4 and all(isinstance(v, (int, float)) for v in pred):
        return [pred]
    return list(pred) if isinstance(pred, (list, tuple)) else []


def _score(item: Any) -> float:
    if isinstance(item, dict):
        try:
            score = float(item.get("score", 1.0))
            return score if math.isfinite(score) else 0.0
        except (TypeError, ValueError):
            return 0.0
    return 1.0
