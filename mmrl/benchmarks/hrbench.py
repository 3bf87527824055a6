"""HR-Bench 4K, as lmms-eval's `hrbench4k`: the question, "A. ..." options, "Answer the option
letter directly."; the answer matched by lmms-eval's rules (a lone option letter, else the one
option whose text the reply contains). What the rules cannot match goes to a GPT judge in
lmms-eval; here it counts as no match (as the judge's "Z" would). Accuracy: the mean over cycle
categories of each one's mean, overall and for the `single` / `cross` categories."""
from __future__ import annotations

import base64
import io
import string
from collections import defaultdict
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, medium, png_cell, write_parquet
from mmrl.types import Sample

REFUSALS = ["Sorry, I can't help with images of people yet.", "I can't process this file.",
            "I'm sorry, but without the image provided", "Cannot determine the answer"]


def options(row: dict) -> dict[str, str]:
    return {c: row[c] for c in string.ascii_uppercase if row.get(c) is not None
            and row[c] == row[c]}  # NaN: no option


def prompt(row: dict) -> str:
    lines = "".join(f"{k}. {v}\n" for k, v in options(row).items())
    return f"{row['question'].strip()}\n{lines}Answer the option letter directly."


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    image = medium(base64.b64decode(row["image"]), root, source, "image")
    return Sample(id=str(row["index"]), messages=chat(prompt(row), images=1),
                  solution=row["answer"], task=row["category"], images=[image], source=source)


def infer(answer: str, choices: dict[str, str]) -> str:
    """lmms-eval's can_infer: exactly one option letter among the reply's words (punctuation
    split off), "Z" for a refusal or a lone Z, else the one option whose text it contains;
    "" when neither decides."""
    if "Failed to obtain answer via API" in answer:
        return ""
    if any(r in answer for r in REFUSALS):
        return "Z"
    words = answer
    for c in ".()[],:;!*#{}":
        words = words.replace(c, " ")
    splits = [w.strip() for w in words.split()]
    named = [c for c in choices if c in splits]
    if len(named) == 1:
        return named[0]
    if not named and sum(z in splits for z in ("Z", "")) == 1:
        return "Z"
    texts = [k for k, v in choices.items() if str(v).lower() in answer.lower()]
    return texts[0] if len(texts) == 1 else ""


def score(row: dict, text: str, ctx: Context) -> dict:
    pred = infer(text.strip(), options(row))
    return {"prediction": pred, "category": row["category"],
            "cycle_category": row["cycle_category"],
            "score": float(pred.lower() == row["answer"].lower())}


def _cycle_mean(rows: list[dict]) -> float:
    groups: dict = defaultdict(list)
    for r in rows:
        groups[r["cycle_category"]].append(r["score"])
    return sum(sum(v) / len(v) for v in groups.values()) / len(groups) if groups else float("nan")


def aggregate(rows: list[dict]) -> dict:
    out = {"accuracy": _cycle_mean(rows)}
    for cat in sorted({r["category"] for r in rows}):
        out[f"accuracy/{cat}"] = _cycle_mean([r for r in rows if r["category"] == cat])
    return out


def write_fixture(root: Path, n: int, seed: int) -> None:
    """hr_bench_4k.parquet: index, question, answer (a letter), category (single / cross),
    A-D, image (base64 of the image file), cycle_category (one id per question, shared by its
    option-rotated copies)."""
    rows = []
    for i in range(n):
        rows.append({"index": i, "question": f" What colour is object {i // 4}? ",
                     "answer": "ABCD"[i % 4], "category": ["single", "cross"][i // 4 % 2],
                     "A": "red", "B": "green", "C": "blue", "D": None if i % 5 == 0 else "pale",
                     "image": base64.b64encode(png_cell(48, 48, seed + i)["bytes"]).decode(),
                     "cycle_category": f"q{i // 4}"})
    write_parquet(root / "hr_bench_4k.parquet", rows)


BENCHMARK = Benchmark(
    name="hrbench4k", title="HR-Bench 4K, high-resolution perception", hub="DreamMr/HR-Bench",
    lmms_task="hrbench4k", files="**/*4k*.parquet", metric="accuracy", to_sample=to_sample,
    score=score, aggregate=aggregate, write_fixture=write_fixture, max_new_tokens=128,
    judge="lmms-eval's GPT option matching for replies its rules cannot match (not run: no "
          "match)")
