"""V* Bench, as lmms-eval's `vstar_bench`: the question with its "(A) ... (B) ..." options
rewritten as lines "A. ...", "Answer with the option's letter from the given choices
directly."; accuracy in percent, overall and per category (direct_attributes,
relative_position). With `tools.use: [crop]` the model may zoom first (the DeepEyes / MGPO
setting); the output says which setting ran."""
from __future__ import annotations

import re
from pathlib import Path

from mmrl.benchmarks.base import (Benchmark, Context, chat, medium, percent, png_cell,
                                  write_parquet)
from mmrl.benchmarks.choice import extract_letter
from mmrl.types import Sample

POST = "\nAnswer with the option's letter from the given choices directly."


def prompt(row: dict) -> str:
    question = row["text"]
    options = re.findall(r"\([A-D]\)\s*([^()]+?)(?=\s*\([A-D]\)|$)", question)
    if options:
        question = question.split("(A)")[0].strip() + "\n" + "\n".join(
            f"{'ABCD'[i]}. {o.strip()}" for i, o in enumerate(options[:4]))
    return question + POST


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return Sample(id=str(row["question_id"]), messages=chat(prompt(row), images=1),
                  solution=row["label"], task=row.get("category") or "unknown",
                  images=[medium(row["image"], root, source, "image")], source=source)


def score(row: dict, text: str, ctx: Context) -> dict:
    letter = extract_letter(text)
    return {"prediction": letter, "category": row.get("category", "unknown"),
            "score": float(letter == row["label"].strip().upper())}


def aggregate(rows: list[dict]) -> dict:
    out = {"accuracy": percent([r["score"] for r in rows]) if rows else 0.0}
    for cat in sorted({r["category"] for r in rows}):
        out[f"accuracy/{cat}"] = percent([r["score"] for r in rows if r["category"] == cat])
    return out


def write_fixture(root: Path, n: int, seed: int) -> None:
    """`data/test-00000-of-00001.parquet`: question_id, image ({bytes, path}), text (question
    with inline "(A) .. (B) .." options), label (a letter), category."""
    cats = ["direct_attributes", "relative_position"]
    rows = [{"question_id": str(i), "image": png_cell(64, 48, seed + i), "category": cats[i % 2],
             "text": f"What is the color of the item {i}? (A) red (B) blue (C) green (D) white",
             "label": "ABCD"[i % 4]} for i in range(n)]
    write_parquet(root / "data" / "test-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="vstar", title="V* Bench, high-resolution visual search",
    hub="lmms-lab-encoder/vstar-bench",
    lmms_task="vstar_bench", files="data/test-*.parquet", metric="accuracy", to_sample=to_sample,
    score=score, aggregate=aggregate, write_fixture=write_fixture, max_new_tokens=16)
