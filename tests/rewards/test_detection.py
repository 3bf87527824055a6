"""iou / giou / detection against torchvision.ops and hand-computed values; mAP vs pycocotools."""
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.ops import box_iou as tv_box_iou
from torchvision.ops import generalized_box_iou as tv_giou

from rewards import get_reward, mean_average_precision
from rewards.boxes import parse_box, parse_boxes, smart_resize

iou = get_reward("iou")
giou = get_reward("giou")
detection = get_reward("detection")


def _random_boxes(rng, n, scale=100.0):
    xy = rng.uniform(0, scale, size=(n, 2))
    wh = rng.uniform(0, scale / 2, size=(n, 2))
    return np.concatenate([xy, xy + wh], axis=1)


def _answer(box):
    return "<answer>[" + ", ".join(repr(float(v)) for v in box) + "]</answer>"


def test_iou_and_giou_equal_torchvision_on_random_boxes():
    rng = np.random.default_rng(0)
    preds, golds = _random_boxes(rng, 400), _random_boxes(rng, 400)
    golds[:50] = preds[:50]  # identical boxes
    golds[50:100, :2] = preds[50:100, :2]  # shared corner
    golds[50:100, 2:] = np.maximum(golds[50:100, 2:], golds[50:100, :2])
    texts, sols = [_answer(p) for p in preds], [g.tolist() for g in golds]
    ref_iou = tv_box_iou(torch.tensor(preds), torch.tensor(golds)).diagonal().tolist()
    ref_giou = tv_giou(torch.tensor(preds), torch.tensor(golds)).diagonal().tolist()
    assert iou(texts, sols) == pytest.approx(ref_iou, abs=1e-12)
    assert giou(texts, sols) == pytest.approx(ref_giou, abs=1e-12)
    assert sum(v == 0.0 for v in ref_iou) > 10  # the sample includes disjoint pairs


# No subnormals: tests/conftest.py flushes them to zero (torch.set_flush_denormal).
finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@settings(max_examples=300, deadline=None)
@given(st.tuples(finite, finite, finite, finite), st.tuples(finite, finite, finite, finite))
def test_iou_equals_torchvision_property(a, b):
    pred = (min(a[0], a[2]), min(a[1], a[3]), max(a[0], a[2]), max(a[1], a[3]))
    gold = (min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3]))
    ours = iou([_answer(pred)], [list(gold)])[0]
    ref = tv_box_iou(torch.tensor([pred], dtype=torch.float64),
                     torch.tensor([gold], dtype=torch.float64))[0, 0].item()
    assert ours == (pytest.approx(ref, abs=1e-12) if ref == ref else 0.0)  # NaN (0/0) -> 0


@pytest.mark.parametrize("answer, expected", [
    ("[0, 0, 10, 10]", 1.0),
    ("The box is (0,0),(10,10).", 1.0),  # Qwen2-VL point-pair format
    ('```json\n[{"bbox_2d": [0, 0, 10, 10], "label": "dog"}]\n```', 1.0),  # Qwen2.5-VL JSON
    ("[0, 0, 5, 10]", 0.5),
    ("[10, 10, 0, 0]", 0.0),  # reversed corners are a wrong answer
    ("[0, 0, 10]", 0.0),
    ("[0, 0, 1e999, 10]", 0.0),
    ("", 0.0),
    ("[0, 0, 10, 10] [50, 50, 60, 60]", 1.0),  # the first box counts
])
def test_iou_parsing(answer, expected):
    assert iou([f"<answer>{answer}</answer>"], [[0, 0, 10, 10]]) == [expected]


def test_iou_solution_forms():
    text = ["<answer>[0, 0, 10, 10]</answer>"]
    for solution in ("[0, 0, 10, 10]", "<answer>[0,0,10,10]</answer>", [[0, 0, 10, 10]],
                     {"bbox_2d": [0, 0, 10, 10]}, [10, 10, 0, 0]):
        assert iou(text, [solution]) == [1.0], solution
    assert iou(text, ["no box"]) == [None]


def test_iou_threshold_is_inclusive():
    texts = [_answer([0, 0, 5, 10]), _answer([0, 0, 4.9, 10])]
    assert iou(texts, [[0, 0, 10, 10]] * 2, threshold=0.5) == [1.0, 0.0]


def test_coordinate_conventions():
    gold = [[64, 48, 320, 240]]  # pixels of a 640x480 image
    size = [[640, 480]]
    assert iou(["<answer>[100, 100, 500, 500]</answer>"], gold, coords="norm1000",
               image_size=size) == [1.0]
    assert iou(["<answer>[0.1, 0.1, 0.5, 0.5]</answer>"], gold, coords="norm1",
               image_size=size) == [pytest.approx(1.0)]
    # Qwen2.5-VL: 640x480 is resized to 644x476 (smart_resize); boxes are in that space.
    resized = [644 * 0.1, 476 * 0.1, 644 * 0.5, 476 * 0.5]
    assert iou([_answer(resized)], gold, coords="resized", image_size=size) == [pytest.approx(1.0)]
    assert iou([_answer([64, 48, 320, 240])], gold, coords="resized", image_size=size,
               resized_size=[[640, 480]]) == [1.0]
    for alias in ("qwen2_vl", "Qwen2-VL"):
        assert iou(["<answer>[100, 100, 500, 500]</answer>"], gold, coords=alias,
                   image_size=size) == [1.0]
    assert iou([_answer(resized)], gold, coords="Qwen2.5-VL", image_size=size) == \
        [pytest.approx(1.0)]
    # A convention that needs the image size, without one: not applicable.
    assert iou(["<answer>[100, 100, 500, 500]</answer>"], gold, coords="norm1000") == [None]
    with pytest.raises(ValueError, match="coords"):
        iou(["<answer>[1, 1, 2, 2]</answer>"], [[1, 1, 2, 2]], coords="weird")


# (height, width) -> transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize with
# min_pixels=3136, max_pixels=12845056 (transformers 5.x; copied to keep this test import-light).
SMART_RESIZE = {(480, 640): (476, 644), (1080, 1920): (1092, 1932), (28, 28): (56, 56),
                (10, 10): (56, 56), (4000, 6000): (2912, 4368), (56, 3000): (56, 2996),
                (333, 517): (336, 504), (8000, 8000): (3584, 3584)}
# A side under half a factor: qwen-vl-utils floors it at one factor before the budget check,
# transformers rounds it to 0 and grows the image. mmrl hands the processor the image already
# resized by qwen-vl-utils, so the library's answer is the model's input frame.
QWEN_VL_UTILS_ONLY = {(14, 2000): (28, 1988), (1, 150): (28, 140)}


@pytest.mark.parametrize("hw", sorted(SMART_RESIZE))
def test_smart_resize_matches_transformers(hw):
    assert smart_resize(*hw) == SMART_RESIZE[hw]


@pytest.mark.parametrize("hw", sorted({**SMART_RESIZE, **QWEN_VL_UTILS_ONLY}))
def test_smart_resize_is_qwen_vl_utils(hw):
    from qwen_vl_utils import smart_resize as library

    assert smart_resize(*hw) == library(*hw, factor=28, min_pixels=3136, max_pixels=12845056)
    assert smart_resize(*hw) == {**SMART_RESIZE, **QWEN_VL_UTILS_ONLY}[hw]


def test_giou_hand_values_and_failures():
    sol = [[0, 0, 1, 1]]
    assert giou(["<answer>[0, 0, 1, 1]</answer>"], sol) == [1.0]
    assert giou(["<answer>[2, 0, 3, 1]</answer>"], sol) == [pytest.approx(-1 / 3)]
    assert giou(["<answer>[100, 100, 101, 101]</answer>"], sol)[0] < -0.9
    assert giou(["<answer>nothing</answer>", "", "<answer>[1, 1, 0, 0]</answer>"], sol * 3) == \
        [0.0, 0.0, 0.0]


def _det(items):
    return "<answer>" + json.dumps([{"bbox_2d": b, "label": l} for b, l in items]) + "</answer>"


def test_detection_hand_computed():
    gold = [{"bbox_2d": [0, 0, 10, 10], "label": "cat"},
            {"bbox_2d": [20, 0, 30, 10], "label": "dog"}]
    perfect = _det([([20, 0, 30, 10], "dog"), ([0, 0, 10, 10], "cat")])
    half = _det([([0, 0, 5, 10], "cat")])  # IoU 0.5 with one of two objects
    spam = _det([([0, 0, 10, 10], "cat"), ([20, 0, 30, 10], "dog")]
                + [([50, 50, 60, 60], "cat")] * 8)
    wrong_label = _det([([0, 0, 10, 10], "dog"), ([20, 0, 30, 10], "cat")])
    below = _det([([0, 0, 4, 10], "cat"), ([20, 0, 30, 10], "dog")])  # IoU 0.4 < 0.5 is dropped
    got = detection([perfect, half, spam, wrong_label, below], [gold] * 5)
    assert got == pytest.approx([1.0, 0.25, 0.2, 0.0, 0.5])
    assert detection([wrong_label], [gold], use_labels=False) == [1.0]
    assert detection([below], [gold], threshold=0.3) == [pytest.approx(0.7)]


def test_detection_matching_is_optimal_not_greedy():
    # Greedy (best pair first) takes p0-g0 (IoU 0.6) and leaves p1 unmatched; the optimal
    # assignment is p0-g1 + p1-g0.
    gold = [[0, 0, 10, 10], [4, 0, 14, 10]]
    preds = "<answer>[[2.5, 0, 12.5, 10], [0, 0, 9, 10]]</answer>"
    ious = tv_box_iou(torch.tensor([[2.5, 0, 12.5, 10], [0, 0, 9, 10]], dtype=torch.float64),
                      torch.tensor(gold, dtype=torch.float64))
    optimal = max(ious[0, 0] + ious[1, 1], ious[0, 1] + ious[1, 0]).item() / 2
    assert detection([preds], [gold]) == [pytest.approx(optimal)]
    assert optimal > (ious[0, 0].item() + 0) / 2


def test_detection_empty_and_truncated():
    gold = [[0, 0, 10, 10]]
    truncated = '<answer>[{"bbox_2d": [0, 0, 10, 10], "label": "x"}, {"bbox_2d": [5, 5</answer>'
    assert detection([truncated], [gold]) == [1.0]
    assert detection(["<answer>[]</answer>", "<answer>nothing</answer>", "<answer>[]</answer>"],
                     [[], [], gold]) == [1.0, 0.0, 0.0]
    assert detection(["<answer>[]</answer>"], ["B"]) == [None]  # not a detection sample


def test_parse_boxes_forms():
    assert parse_boxes("[[1, 2, 3, 4], [5, 6, 7, 8]]") == [((1, 2, 3, 4), None),
                                                           ((5, 6, 7, 8), None)]
    assert parse_boxes('{"bbox": [1, 2, 3, 4], "category": "Cat"}') == [((1, 2, 3, 4), "cat")]
    assert parse_boxes("boxes: [1,2,3,4] and [5,6,7,8]") == [((1, 2, 3, 4), None),
                                                            ((5, 6, 7, 8), None)]
    assert parse_box("x: 1 y: 2 w: 3 h") is None


def _coco_ap50(preds, gts):
    """pycocotools AP@0.5 for per-image lists of (box, label[, score])."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    labels = sorted({g[1] for image in gts for g in image}
                    | {p[1] for image in preds for p in image})
    cat = {name: i + 1 for i, name in enumerate(labels)}
    images, anns, dets = [], [], []
    for i, (image_preds, image_gts) in enumerate(zip(preds, gts)):
        images.append({"id": i + 1, "width": 1000, "height": 1000})
        for box, label in image_gts:
            w, h = box[2] - box[0], box[3] - box[1]
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cat[label],
                         "bbox": [box[0], box[1], w, h], "area": w * h, "iscrowd": 0})
        for box, label, score in image_preds:
            dets.append({"image_id": i + 1, "category_id": cat[label], "score": score,
                         "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    coco = COCO()
    coco.dataset = {"images": images, "annotations": anns,
                    "categories": [{"id": v, "name": k} for k, v in cat.items()]}
    coco.createIndex()
    if not dets:
        return 0.0
    evaluator = COCOeval(coco, coco.loadRes(dets), "bbox")
    evaluator.params.iouThrs = np.array([0.5])
    evaluator.evaluate()
    evaluator.accumulate()
    precision = evaluator.eval["precision"][0, :, :, 0, -1]  # [R, K] at area "all", maxDets 100
    per_class = [precision[:, k].mean() for k in range(precision.shape[1])
                 if (precision[:, k] > -1).any()]
    return float(np.mean(per_class)) if per_class else 0.0


@pytest.mark.parametrize("seed", range(6))
def test_map50_equals_pycocotools(seed, capsys):
    rng = np.random.default_rng(seed)
    preds, gts = [], []
    for _ in range(8):
        gt_boxes = _random_boxes(rng, int(rng.integers(1, 5)), scale=200)
        image_gts = [(b.round(1).tolist(), str(rng.choice(["cat", "dog", "cow"])))
                     for b in gt_boxes]
        image_preds = []
        for box, label in image_gts:  # jittered hits and misses, plus false positives
            if rng.random() < 0.8:
                jitter = rng.normal(0, 6, size=4)
                b = np.sort((np.array(box) + jitter).reshape(2, 2), axis=0).reshape(-1)
                b = [min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3])]
                image_preds.append((np.round(b, 1).tolist(), label, float(rng.random())))
        for b in _random_boxes(rng, int(rng.integers(0, 3)), scale=200):
            image_preds.append((b.round(1).tolist(), str(rng.choice(["cat", "dog"])),
                                float(rng.random())))
        preds.append(image_preds)
        gts.append(image_gts)
    ours = mean_average_precision(
        [[{"bbox": b, "label": l, "score": s} for b, l, s in p] for p in preds],
        [[{"bbox": b, "label": l} for b, l in g] for g in gts])
    reference = _coco_ap50(preds, gts)
    capsys.readouterr()  # pycocotools prints progress
    assert ours == pytest.approx(reference, abs=1e-9)
    assert 0.0 < ours < 1.0
