"""Does a classification run tell circle from square? Count the lone shapes it names right.

Reads a run's held-out evaluations (RUN/eval/before_rl.jsonl, step_*.jsonl, after_rl.jsonl: rows
with `answer`, `solution` and `metric`) and prints, per file, the mean metric and how many of the
records whose answer is one shape alone (`--shapes`) were answered with exactly that shape. On
the learning table's shapes task triangles are read early; a run whose lone squares are all
"circle" (or the reverse) has not yet learned the two apart (research/README.md, rounds 3-4).
Any exact answers work as "shapes": `--shapes 1,2,3` gives clip_counting's recall per count.
`--named` adds what those records were answered instead (clip_counting: which count a 3-clip
video was taken for), and `--rollouts` reads the sampled groups of RUN/rollouts.jsonl per
logged step instead of the greedy evaluations.

    python research/probes/lone_shapes.py runs/learning/classification_s3 [more runs ...]
    python research/probes/lone_shapes.py runs/learning/clip_counting_s0 --shapes 1,2,3 --named
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def count(rows: list[dict], shapes: list[str]) -> dict:
    """{"metric": mean metric (nan without one: rollouts), shape: (named right, records),
    "named": {shape: Counter of the answers those records got}}."""
    metrics = [r["metric"] for r in rows if "metric" in r]
    out = {"metric": sum(metrics) / len(metrics) if metrics else float("nan"), "named": {}}
    for s in shapes:
        answers = [(r["answer"] or "").strip() for r in rows if r["solution"].strip() == s]
        out[s] = (answers.count(s), len(answers))
        out["named"][s] = Counter(answers)
    return out


def eval_files(run: Path) -> list[Path]:
    """The run's evaluations in training order: before RL, each step, after RL."""
    ev = run / "eval"
    files = [ev / "before_rl.jsonl", *sorted(ev.glob("step_*.jsonl")), ev / "after_rl.jsonl"]
    return [f for f in files if f.exists()]


def rollout_steps(run: Path) -> list[tuple[str, list[dict]]]:
    """The run's logged rollout groups (RUN/rollouts.jsonl), one (label, rows) per step."""
    steps: dict[int, list[dict]] = {}
    for line in (run / "rollouts.jsonl").open():
        r = json.loads(line)
        steps.setdefault(r["step"], []).append(r)
    return [(f"rollouts step {k}", v) for k, v in sorted(steps.items())]


def _cell(s: str, c: dict, named: bool) -> str:
    text = f"{s} {c[s][0]}/{c[s][1]}"
    if named and c["named"][s]:
        text += " (" + ", ".join(f"{a or '-'}: {k}" for a, k in sorted(c["named"][s].items())) + ")"
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--shapes", default="circle,square")
    ap.add_argument("--named", action="store_true", help="also what the records were answered")
    ap.add_argument("--rollouts", action="store_true", help="the sampled groups, per step")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    for run in args.runs:
        groups = (rollout_steps(run) if args.rollouts else
                  [(f.stem, [json.loads(line) for line in f.open()]) for f in eval_files(run)])
        cells = []
        for label, rows in groups:
            c = count(rows, shapes)
            cells.append(f"{label}: {c['metric']:.2f} " +
                         " ".join(_cell(s, c, args.named) for s in shapes))
        print(f"{run}\n  " + "\n  ".join(cells))


if __name__ == "__main__":
    main()
