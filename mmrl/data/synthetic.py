"""Deterministic generators for the small bundled datasets (tiny models must learn from them).

Each generator writes PNG/mp4/wav files plus `train.jsonl` / `eval.jsonl` in the mmrl schema and
is idempotent: same arguments, same bytes. `mmrl data generate NAME OUT_DIR [k=v ...]`.
"""
from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from mmrl.data.schema import write_jsonl
from mmrl.registry import Registry

GENERATORS: Registry = Registry("data generator")


@GENERATORS.register("counting")
def counting(out_dir: str | Path, n_train: int = 2000, n_eval: int = 200, seed: int = 0,
             size: int = 56, square: int = 24, max_count: int = 4,
             choices: bool = False) -> dict[str, str]:
    """White `size`x`size` images with 1..max_count red squares, at most one per quadrant.

    Why this task: a ~1M-parameter random Qwen-VL learns it from pixels in minutes on CPU
    (56 px = 4 visual tokens after 2x2 merge), while smaller objects were not learned
    (docs/install-notes.md). Chance accuracy is 1/max_count. `choices=True` makes it a
    multiple-choice VQA task (options "A. 1" ..., solution a letter, task "vqa").
    """
    if not 1 <= max_count <= 4 or square > size // 2:
        raise ValueError("counting: max_count must be 1..4 and square <= size/2 (one per quadrant)")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    half = size // 2
    records = []
    for i in range(n_train + n_eval):
        count = rng.randint(1, max_count)
        quadrants = rng.sample(range(4), count)
        im = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(im)
        boxes = []
        for q in quadrants:
            x0 = (q % 2) * half + rng.randint(0, half - square)
            y0 = (q // 2) * half + rng.randint(0, half - square)
            draw.rectangle([x0, y0, x0 + square - 1, y0 + square - 1], fill=(220, 30, 30))
            boxes.append([x0, y0, x0 + square, y0 + square])
        name = f"images/{i:05d}.png"
        im.save(out / name)
        record = {
            "id": f"count-{i:05d}", "task": "counting", "images": [name],
            "prompt": "How many red squares are there? Answer with <answer>N</answer>.",
            "solution": str(count), "boxes": boxes, "image_size": [size, size],
        }
        if choices:
            options = [f"{chr(65 + k)}. {k + 1}" for k in range(max_count)]
            record.update(task="vqa", solution=chr(64 + count), options=options,
                          prompt="How many red squares are there?\n" + "\n".join(options) +
                          "\nAnswer with the option letter in <answer></answer>.")
        records.append(record)
    write_jsonl(out / "train.jsonl", records[:n_train])
    write_jsonl(out / "eval.jsonl", records[n_train:])
    return {"train": str(out / "train.jsonl"), "eval": str(out / "eval.jsonl")}

