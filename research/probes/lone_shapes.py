"""Does a classification run tell circle from square? Count the lone shapes it names right.

Reads a run's held-out evaluations (RUN/eval/before_rl.jsonl, step_*.jsonl, after_rl.jsonl: rows
with `answer`, `solution` and `metric`) and prints, per file, the mean metric and how many of the
records whose answer is one shape alone (`--shapes`) were answered with exactly that shape. On
the learning table's shapes task triangles are read early; a run whose lone squares are all
"circle" (or the reverse) has not yet learned the two apart (research/README.md, rounds 3-4).
Any exact answers work as "shapes": `--shapes 1,2,3` gives clip_counting's recall per count.

    python research/probes/lone_shapes.py runs/learning/classification_s3 [more runs ...]
    python research/probes/lone_shapes.py runs/learning/clip_counting_s0 --shapes 1,2,3
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def count(rows: list[dict], shapes: list[str]) -> dict:
    """{"metric": mean metric, shape: (named right, records)} over rows whose solution is `shape`."""
    out = {"metric": sum(r["metric"] for r in rows) / len(rows) if rows else float("nan")}
    for s in shapes:
        alone = [r for r in rows if r["solution"].strip() == s]
        out[s] = (sum((r["answer"] or "").strip() == s for r in alone), len(alone))
    return out


def eval_files(run: Path) -> list[Path]:
    """The run's evaluations in training order: before RL, each step, after RL."""
    ev = run / "eval"
    files = [ev / "before_rl.jsonl", *sorted(ev.glob("step_*.jsonl")), ev / "after_rl.jsonl"]
    return [f for f in files if f.exists()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--shapes", default="circle,square")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    for run in args.runs:
        cells = []
        for f in eval_files(run):
            c = count([json.loads(line) for line in f.open()], shapes)
            cells.append(f"{f.stem}: {c['metric']:.2f} " +
                         " ".join(f"{s} {c[s][0]}/{c[s][1]}" for s in shapes))
        print(f"{run}\n  " + "\n  ".join(cells))


if __name__ == "__main__":
    main()
