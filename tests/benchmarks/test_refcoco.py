"""RefCOCO val: mmrl's layout reader, prompt and scorer equal lmms-eval's `refcoco_bbox_rec_val`
(process_docs, doc_to_text, process_results, every aggregation) on a fixture in the Hub schema
and >= 200 predictions: exact, shifted, pixel-scale, reversed, malformed and empty."""
import math
import random

import pytest
from pathlib import Path

from mmrl.benchmarks import refcoco
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module


def predictions(rows: list[dict], n: int) -> list[tuple[dict, str]]:
    rng, out = random.Random(7), []
    forms = [
        lambda b: f"[{b[0]:.3f}, {b[1]:.3f}, {b[2]:.3f}, {b[3]:.3f}]",  # right
        lambda b: f"The box is [{b[0] + .05:.2f},{b[1]:.2f}, {b[2] + .05:.2f}, {b[3]:.2f}].",
        lambda b: f"[{b[0] * 100:.0f}, {b[1] * 100:.0f}, {b[2] * 100:.0f}, {b[3] * 100:.0f}]",
        lambda b: f"[{b[2]:.2f}, {b[3]:.2f}, {b[0]:.2f}, {b[1]:.2f}]",  # reversed corners
        lambda b: f"({b[0]:.2f}, {b[1]:.2f}, {b[2]:.2f}, {b[3]:.2f})",  # not brackets: malformed
        lambda b: f"[{b[0]:.2f}, {b[1]:.2f}, {b[2]:.2f}]",  # three numbers
        lambda b: "",
        lambda b: "I cannot tell.",
        lambda b: f"[-0.1, {b[1]:.2f}, {b[2]:.2f}, 1.2] and later [0, 0, 1, 1]",
        lambda b: f"[ {rng.random() / 2:.4f} , {rng.random() / 2:.4f}, 0.9, 0.95 ]",
        lambda b: f"[{b[0]:.1e}, 0.1, 0.5, 0.5]",  # exponent: the regex takes no exponent
        lambda b: "[0.25,0.25,0.75,0.75]",
    ]
    for i in range(n):
        row = rows[i % len(rows)]
        out.append((row, forms[i % len(forms)](row["bbox"])))
    return out


def test_layout_prompt_and_scores_equal_lmms_eval(tmp_path):
    lm = task_module("refcoco.utils_rec")
    import datasets

    refcoco.write_fixture(tmp_path, 40, 0)
    ours = refcoco.BENCHMARK.rows(tmp_path)
    import pyarrow.parquet as pq

    table = pq.read_table(next(tmp_path.glob("data/val-*.parquet"))).to_pylist()
    theirs = lm.refcoco_bbox_rec_preprocess_dataset(
        datasets.Dataset.from_list(table).cast_column("image", datasets.Image()))
    assert len(ours) == len(theirs) > 40  # exploded: one row per expression
    for a, b in zip(ours, theirs):
        assert (a["answer"], a["question_id"]) == (b["answer"], b["question_id"])
        assert a["bbox"] == pytest.approx(b["bbox"], abs=0, rel=1e-12)
        sample = refcoco.to_sample(a, tmp_path, "t", Context())
        assert sample.messages[0]["content"][-1]["text"] == lm.refcoco_bbox_rec_doc_to_text(b)

    pairs = predictions(ours, 264)
    ctx = Context()
    mine = [refcoco.score(row, text, ctx) for row, text in pairs]
    results = []
    for (row, text), m in zip(pairs, mine):
        res = lm.refcoco_bbox_rec_process_result(row, [text])["refcoco_IoU"]
        assert m["pred"] == res["pred"], text
        results.append(res)
    got = refcoco.aggregate(mine)
    for metric in lm.COCO_REC_METRICS:
        want = lm.refcoco_bbox_rec_aggregation_result(results, metric)
        assert math.isclose(got[metric], want, rel_tol=1e-12, abs_tol=1e-15), metric
    assert 0 < got["ACC@0.5"] < 1  # the fixture's predictions hold right and wrong ones


def test_family_coordinates_map_back_to_fractions():
    """Qwen2.5-VL writes pixels of its resized input: a 640x480 image is seen at 644x476
    (smart_resize), so [161, 119, 483, 357] is the box [0.25, 0.25, 0.75, 0.75] of the image."""
    row = {"bbox": [0.25, 0.25, 0.75, 0.75], "image_width": 640, "image_height": 480}
    got = refcoco.score(row, "[161, 119, 483, 357]", Context(box_coords="resized"))
    assert got["IoU"] == pytest.approx(1.0, abs=1e-9)
    got = refcoco.score(row, "[250, 250, 750, 750]", Context(box_coords="norm1000"))
    assert got["ACC@0.5"] == 1.0
    assert "integers between 0 and 1000" in refcoco.to_sample(
        {**row, "question_id": 1, "answer": "x", "image": "a.png"}, Path("/"),
        "t", Context(box_coords="norm1000")).messages[0]["content"][-1]["text"]
