"""MMAU test-mini, as lmms-eval's `mmau_test_mini`: the question, its choices as "A. ...",
"Answer with the option's letter from the given choices directly."; accuracy in percent, overall
and per task (sound / music / speech)."""
from __future__ import annotations

import io
import json
import wave
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, medium, percent, write_parquet
from mmrl.benchmarks.choice import parse_multi_choice
from mmrl.types import Sample

POST = "\nAnswer with the option's letter from the given choices directly."
LETTERS = "ABCDEFGHIJ"


def prompt(row: dict) -> str:
    choices = json.loads(row["choices"])
    return (row["question"] + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
            + POST)


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return Sample(id=str(row["id"]), messages=chat(prompt(row), audios=1), solution=row["answer"],
                  task=row["task"], audios=[medium(row["audio"], root, source, "audio")],
                  source=source)


def score(row: dict, text: str, ctx: Context) -> dict:
    """lmms-eval reads only A-D; a letter past the row's choices (lmms-eval: IndexError) is
    wrong here."""
    choices = json.loads(row["choices"])
    letter = parse_multi_choice(text, ["A", "B", "C", "D"], ctx.rng)
    index = ord(letter) - ord("A")
    answer = choices[index] if index < len(choices) else ""
    return {"prediction": answer, "task": row["task"],
            "overall": float(answer.strip().lower() == row["answer"].strip().lower())}


def aggregate(rows: list[dict]) -> dict:
    out = {"accuracy": round(percent([r["overall"] for r in rows]), 5) if rows else float("nan")}
    for task in sorted({r["task"] for r in rows}):
        sub = [r["overall"] for r in rows if r["task"] == task]
        out[f"accuracy/{task}"] = round(percent(sub), 5)
    return out


def wav_cell(seconds: float, seed: int) -> dict:
    """An audio cell as `datasets` writes one to Parquet: {"bytes": WAV, "path": name}."""
    import numpy as np

    pcm = (np.sin(np.arange(int(16000 * seconds)) * (0.01 + seed % 7 * 0.003)) * 8000)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(pcm.astype("<i2").tobytes())
    return {"bytes": buf.getvalue(), "path": f"{seed}.wav"}


def write_fixture(root: Path, n: int, seed: int) -> None:
    """`data/test_mini-00000-of-00001.parquet`: id, audio ({bytes, path}), question, choices (a
    JSON string), answer (the choice's text), task, dataset, category, difficulty."""
    tasks = ["sound", "music", "speech"]
    rows = []
    for i in range(n):
        choices = [f"option {i}-{k}" for k in range(2 + i % 3)]
        rows.append({"id": f"mmau-{i}", "audio": wav_cell(0.5, seed + i),
                     "question": f"What is heard in clip {i}?", "choices": json.dumps(choices),
                     "answer": choices[i % len(choices)], "task": tasks[i % 3],
                     "dataset": "fixture", "category": "fixture", "difficulty": "easy"})
    write_parquet(root / "data" / "test_mini-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="mmau", title="MMAU test-mini, audio multiple choice", hub="lmms-lab-audio/mmau",
    lmms_task="mmau_test_mini", files="data/test_mini-*.parquet", metric="accuracy",
    to_sample=to_sample, score=score, aggregate=aggregate, write_fixture=write_fixture,
    max_new_tokens=128)
