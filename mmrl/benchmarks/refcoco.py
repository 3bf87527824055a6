"""RefCOCO val, as lmms-eval's `refcoco_bbox_rec_val`: one row per referring expression, the
box asked for as four fractions of the image, Acc@0.5 IoU (and IoU, Acc@{0.1..0.9}, Center
accuracy) against the COCO box.

The family's coordinate convention: lmms-eval's prompt asks for fractions (`coords: norm1`,
the parity setting). Qwen2.5-VL writes pixels of its resized input, Qwen2-VL/Qwen3-VL 0..1000:
`coords: family` asks in the family's own convention and maps its box back to fractions before
lmms-eval's IoU (the number VLM-R1 reports is measured that way)."""
from __future__ import annotations

import re
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, medium, png_cell, write_parquet
from mmrl.types import Sample
from rewards.boxes import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, pixel_scale

PROMPT = ("Bounding box coordinates are specified in the format (top-left x, top-left y, "
          "bottom-right x, bottom-right y). All values are floating point numbers bounded "
          "between 0 and 1. Please provide the bounding box coordinate of the region this "
          "sentence describes: ")
# The family's own wording for the sentence that names the convention (coords: family).
FAMILY_SENTENCE = {
    "resized": "All values are integer pixel coordinates of the image as you see it.",
    "norm1000": "All values are integers between 0 and 1000, relative to the image size.",
    "absolute": "All values are integer pixel coordinates of the original image.",
    "norm1": "All values are floating point numbers bounded between 0 and 1.",
}
THRESHOLDS = {"ACC@0.1": 0.1, "ACC@0.3": 0.3, "ACC@0.5": 0.5, "ACC@0.7": 0.7, "ACC@0.9": 0.9}
_FOUR = re.compile(r"\[\s*(-?\d+(?:\.\d+)?),\s*(-?\d+(?:\.\d+)?),\s*(-?\d+(?:\.\d+)?),"
                   r"\s*(-?\d+(?:\.\d+)?)\s*\]")


def explode(rows: list[dict]) -> list[dict]:
    """lmms-eval's process_docs: the COCO box [x, y, w, h] as fractions [x1, y1, x2, y2] of the
    image, and one row per referring expression (`answer` is a list of them)."""
    out = []
    for row in rows:
        w, h = _size(row)
        x, y, bw, bh = row["bbox"]
        box = [x / w, y / h, (x + bw) / w, (y + bh) / h]
        out += [{**row, "answer": a, "bbox": box, "image_width": w, "image_height": h}
                for a in row["answer"]]
    return out


def _size(row: dict) -> tuple[int, int]:
    import io

    from PIL import Image

    cell = row["image"]
    with Image.open(io.BytesIO(cell["bytes"])) as im:
        return im.width, im.height


def parse_box(text: str) -> list[float]:
    """The first `[a, b, c, d]` in the text, else [0, 0, 0, 0] (lmms-eval's rule)."""
    m = _FOUR.search(text)
    return [float(m.group(i)) for i in range(1, 5)] if m else [0, 0, 0, 0]


def iou(a: list[float], b: list[float]) -> float:
    """lmms-eval's IoU, reversed boxes included (their signed areas enter the union as is); an
    empty union, where lmms-eval divides by zero, is 0."""
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    text = PROMPT
    if ctx.box_coords != "norm1":
        text = text.replace(FAMILY_SENTENCE["norm1"], FAMILY_SENTENCE[ctx.box_coords])
    return Sample(id=str(row["question_id"]) + "/" + row["answer"], messages=chat(
        text + row["answer"], images=1), solution=row["bbox"], task="refcoco",
        images=[medium(row["image"], root, source, "image")], source=source,
        fields={"image_size": [row["image_width"], row["image_height"]]})


def score(row: dict, text: str, ctx: Context) -> dict:
    pred = parse_box(text)
    if ctx.box_coords != "norm1" and pred != [0, 0, 0, 0]:  # the family's frame -> fractions
        w, h = row["image_width"], row["image_height"]
        sx, sy = pixel_scale(ctx.box_coords, [w, h], None, ctx.min_pixels or QWEN_MIN_PIXELS,
                             ctx.max_pixels or QWEN_MAX_PIXELS)
        pred = [pred[0] * sx / w, pred[1] * sy / h, pred[2] * sx / w, pred[3] * sy / h]
    gt, value = row["bbox"], iou(row["bbox"], pred)
    cx, cy = (pred[0] + pred[2]) / 2, (pred[1] + pred[3]) / 2
    return {"pred": pred, "bbox": gt, "IoU": value,
            **{k: float(value >= t) for k, t in THRESHOLDS.items()},
            "Center_ACC": float(gt[0] <= cx <= gt[2] and gt[1] <= cy <= gt[3])}


def aggregate(rows: list[dict]) -> dict:
    keys = ["IoU", *THRESHOLDS, "Center_ACC"]
    return {k: (sum(r[k] for r in rows) / len(rows) if rows else float("nan")) for k in keys}


def write_fixture(root: Path, n: int, seed: int) -> None:
    """`data/val-00000-of-00001.parquet` with the Hub columns: question_id, image ({bytes,
    path}), question, answer (a list of expressions), bbox ([x, y, w, h] pixels), file_name."""
    rows = []
    for i in range(n):
        w, h = 48 + 8 * (i % 3), 40 + 8 * (i % 2)
        rows.append({"question_id": str(1000 + i), "image": png_cell(w, h, seed + i),
                     "question": "Please carefully observe the area circled in the image and "
                                 "come up with a caption for the area.",
                     "answer": [f"the object number {i}", f"thing {i} on the left"][:1 + i % 2],
                     "bbox": [float(2 + i % 5), float(3 + i % 4), 20.0, 16.0],
                     "file_name": f"COCO_train2014_{i:012d}.jpg"})
    write_parquet(root / "data" / "val-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="refcoco", title="RefCOCO val, referring-expression boxes", hub="lmms-lab/RefCOCO",
    lmms_task="refcoco_bbox_rec_val", files="data/val-*.parquet", metric="ACC@0.5",
    to_sample=to_sample, score=score, aggregate=aggregate, write_fixture=write_fixture,
    prepare=explode, max_new_tokens=128,
    notes="coords: norm1 is lmms-eval's prompt and scorer; family maps the family's boxes")
