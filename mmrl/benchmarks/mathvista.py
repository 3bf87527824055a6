"""MathVista testmini, as lmms-eval's `mathvista_testmini_format` (the question, "A. ..." choices,
the answer-type hint: "Answer with the option's letter from the given choices directly.", "Answer
the question using a single integer number.", ...), scored on lmms-eval's rule-based path only.

No judge model: lmms-eval extracts the answer with rules first (the response is a choice, an
int, a float, or says `The answer is "X".`) and hands the rest to a GPT judge. Here the rest
extracts as "" (what lmms-eval keeps when its judge returns nothing), so a free-form answer the
rules cannot read is wrong and a multiple-choice one becomes its nearest choice by edit distance,
as lmms-eval's normaliser does. The judged number is out of scope (`judge_metrics`)."""
from __future__ import annotations

import re
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, medium, png_cell, write_parquet
from mmrl.types import Sample

HINTS = {("multi_choice", None): "Answer with the option's letter from the given choices directly.",
         ("integer", None): "Answer the question using a single integer number.",
         ("float", 1): "Answer the question using a single floating-point number with one decimal "
                       "place.",
         ("float", 2): "Answer the question using a single floating-point number with two decimal "
                       "places.",
         ("list", None): "Answer the question using a Python list."}


def _hint(row: dict) -> str:
    """The format hint; lmms-eval has none for a float of another precision (it fails there)."""
    if row["question_type"] == "multi_choice":
        return HINTS[("multi_choice", None)]
    kind = row["answer_type"]
    return HINTS.get((kind, int(row.get("precision") or 0) if kind == "float" else None), "")


def prompt(row: dict) -> str:
    question = row["question"] + (f" (Unit: {row['unit']})" if row.get("unit") else "")
    choices = "\n".join(f"{chr(ord('A') + i)}. {c}" for i, c in enumerate(row.get("choices") or []))
    return "\n".join(e for e in [question, choices, _hint(row)] if e).strip()


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return Sample(id=str(row["pid"]), messages=chat(prompt(row), images=1), solution=row["answer"],
                  task=row["question_type"], source=source,
                  images=[medium(row["decoded_image"], root, source, "decoded_image")])


def extract(response: str, row: dict) -> str:
    """lmms-eval's rule-based extraction (quick_extract on); the judge's turn gives ""."""
    choices = row.get("choices") or []
    if not response:
        return ""
    if row["question_type"] == "multi_choice" and response in choices:
        return response
    for kind, cast in (("integer", lambda r: str(int(r))), ("float", lambda r: str(float(r)))):
        if row["answer_type"] == kind:
            try:
                return cast(response)
            except ValueError:
                pass
    found = re.search(r'The answer is "(.*)"\.', response)
    return found.group(1) if found else ""


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions: cost 1 each)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def normalize(extraction: str, row: dict) -> str | None:
    """The extraction in the answer's form: a choice's text (by letter, else the nearest
    choice), an int, a float rounded to the row's precision, or the list's text."""
    kind, choices = row["answer_type"], row.get("choices") or []
    if row["question_type"] == "multi_choice":
        extraction = extraction.strip()
        letter = re.findall(r"\(([a-zA-Z])\)", extraction)
        if letter:
            extraction = letter[0].upper()
        options = [chr(ord("A") + i) for i in range(len(choices))]
        if extraction in options:
            return choices[options.index(extraction)]
        distances = [edit_distance(extraction, c) for c in choices]
        return choices[distances.index(min(distances))]
    try:
        if kind == "integer":
            return str(int(float(extraction)))
        if kind == "float":
            # lmms-eval passes the row's precision as stored: the Hub's float64 (1.0) makes
            # round() raise, so a float answer normalises to None and is wrong there. Kept: the
            # number must be lmms-eval's (docs/benchmarks-eval.md says so).
            return str(round(float(extraction), row["precision"] if "precision" in row else 0))
    except (ValueError, OverflowError, TypeError):
        return None
    return str(extraction) if kind == "list" else extraction


def score(row: dict, text: str, ctx: Context) -> dict:
    extraction = extract(text.strip(), row)
    prediction = normalize(extraction, row)
    return {"extraction": extraction, "prediction": prediction, "task": row["question_type"],
            "true_false": str(prediction).strip() == str(row["answer"]).strip()}


def aggregate(rows: list[dict]) -> dict:
    """Accuracy in percent, rounded to 2 places as lmms-eval rounds it (lmms-eval reports None
    for exactly 0; here 0.0), and per question type."""
    out = {"accuracy": round(sum(r["true_false"] for r in rows) / len(rows) * 100, 2)
           if rows else float("nan")}
    for kind in sorted({r["task"] for r in rows}):
        sub = [r["true_false"] for r in rows if r["task"] == kind]
        out[f"accuracy/{kind}"] = round(sum(sub) / len(sub) * 100, 2)
    return out


def write_fixture(root: Path, n: int, seed: int) -> None:
    """`data/testmini-00000-of-00001.parquet` with the Hub columns: pid, question, image (its
    path), decoded_image ({bytes, path}), choices (a list or null), unit, precision, answer,
    question_type, answer_type, query, metadata (split, language, source, category, task,
    context, grade, skills)."""
    kinds = [("multi_choice", "text"), ("free_form", "integer"), ("free_form", "float"),
             ("free_form", "list")]
    rows = []
    for i in range(n):
        qtype, atype = kinds[i % 4]
        choices = [f"{k + i}" for k in range(2 + i % 3)] if qtype == "multi_choice" else None
        precision = float(1 + i % 2) if atype == "float" else None
        answer = {"text": choices[0] if choices else "", "integer": str(i),
                  "float": f"{i / 4:.{int(precision or 1)}f}", "list": f"[{i}, {i + 1}]"}[atype]
        row = {"pid": str(i + 1), "question": f"What is shown in figure {i}?",
               "image": f"images/{i + 1}.jpg", "decoded_image": png_cell(40, 32, seed + i),
               "choices": choices, "unit": "cm" if i % 5 == 0 else None, "precision": precision,
               "answer": answer, "question_type": qtype, "answer_type": atype,
               "metadata": {"split": "testmini", "language": "english", "source": "fixture",
                            "category": "math-targeted-vqa", "task": "figure question answering",
                            "context": "synthetic scene", "grade": "high school",
                            "skills": ["arithmetic reasoning"], "img_width": 40, "img_height": 32}}
        row["query"] = prompt(row)
        rows.append(row)
    write_parquet(root / "data" / "testmini-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="mathvista", title="MathVista testmini, visual math (rule-based answer extraction)",
    hub="AI4Math/MathVista", lmms_task="mathvista_testmini_format",
    files="data/testmini-*.parquet", metric="accuracy", to_sample=to_sample, score=score,
    aggregate=aggregate, write_fixture=write_fixture, max_new_tokens=16384,
    judge="lmms-eval's GPT answer extraction (free-form answers its rules cannot read)",
    notes="rule-based extraction only: what lmms-eval's judge would read is scored as empty")
