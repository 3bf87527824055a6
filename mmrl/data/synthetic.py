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


def paint_scenes(folder: str | Path, n: int = 240, seed: int = 0, size: int = 112) -> list[Path]:
    """`n` outdoor scenes with an up (sky above a horizon, a sun in the sky, a tree standing on
    the ground): a stand-in for a folder of the user's own photos, which the `rotation` pretext
    task needs (a photo's orientation must be visible). PNG, deterministic."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        im = Image.new("RGB", (size, size))
        draw = ImageDraw.Draw(im)
        horizon = rng.randint(size // 2, size * 7 // 10)
        draw.rectangle([0, 0, size, horizon], fill=(rng.randint(80, 140), rng.randint(150, 200),
                                                    rng.randint(220, 255)))
        draw.rectangle([0, horizon, size, size], fill=(rng.randint(40, 100),
                                                       rng.randint(120, 170), rng.randint(30, 70)))
        r = rng.randint(size // 14, size // 8)
        cx, cy = rng.randint(r, size - r), rng.randint(r, max(r, horizon // 2))
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(255, 220, 60))
        tx, h = rng.randint(size // 8, size * 7 // 8), size // 6
        draw.rectangle([tx - 2, horizon - h, tx + 2, horizon + size // 20], fill=(110, 70, 30))
        draw.ellipse([tx - size // 10, horizon - h - size // 8, tx + size // 10,
                      horizon - h + size // 16], fill=(20, 90, 20))
        paths.append(folder / f"photo_{i:04d}.png")
        im.save(paths[-1])
    return paths

