"""Where does a tool run look first, and does that first look show what must be read?

Reads a run's held-out evaluations (RUN/eval/before_rl.jsonl, step_*.jsonl, after_rl.jsonl; the
first draw of each record) and prints, per file: the mean metric, the most common first turns
(what greedy does), how many first looks *found* the target, how many of those were answered
right, how many trajectories hit the turn cap, and the answers given.

*found* is stricter than the learning table's tool-use column (`learning_table.tool_use`, any
look whose span holds the whole flash span): here only the FIRST call counts, and a `frames`
call finds the flash when one of the frames it returned falls inside `flash_span`; a `crop`
call finds the mark when its box holds `mark_box` (within the run's looked_at `max_ratio`).
`--halves` also splits the records by where the video's card starts (first or second half of
the clip): a policy that always looks at one half is right on that half's share only.
`--rollouts` reads the sampled trajectories of RUN/rollouts.jsonl per logged RL step instead
(the metric there is the accuracy reward): do the samples still look at both halves?

    python research/probes/first_looks.py runs/learning/video_search_s0 [more runs ...] --halves
    python research/probes/first_looks.py runs/learning/video_search_s0 --halves --rollouts
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research"))
from learning_table import _looked_at_ratio  # noqa: E402
from rewards.looked_at import holds  # noqa: E402


def first_found(row: dict, ratio: float | None) -> bool | None:
    """Whether the row's first tool call showed its target (None: the record has none)."""
    fields = row["fields"]
    first = row["calls"][0]["seen"] if row.get("calls") else []
    if "flash_span" in fields:
        lo, hi = fields["flash_span"]
        return any(lo <= t < hi for s in first for t in s.get("timestamps", ()))
    if "mark_box" in fields:
        return any("box" in s and holds(s["box"], fields["mark_box"], ratio) for s in first)
    return None


def _metric(row: dict) -> float:
    """An evaluation row's metric, or a sampled rollout's accuracy reward."""
    return float(row["metric"] if "metric" in row else row["rewards"].get("accuracy") or 0.0)


def summarise(rows: list[dict], ratio: float | None, halves: bool) -> dict:
    found = [first_found(r, ratio) for r in rows]
    out = {"records": len(rows), "metric": sum(map(_metric, rows)) / len(rows),
           "first_turns": Counter(r["turns"][0] if r.get("turns") else "" for r in rows),
           "found": sum(bool(f) for f in found),
           "right_when_found": sum(_metric(r) for r, f in zip(rows, found) if f),
           "hit_turn_cap": sum(bool(r.get("hit_turn_cap")) for r in rows),
           "answers": Counter(r.get("answer") for r in rows)}
    if halves:
        def half(r):
            start, duration = r["fields"]["card_span"][0], r["fields"]["duration"]
            return "first" if start < duration / 2 else "second"
        out["card_half"] = Counter(half(r) for r in rows if "card_span" in r["fields"])
        out["right_by_half"] = Counter()
        for r in rows:
            if "card_span" in r["fields"]:
                out["right_by_half"][half(r)] += _metric(r)
    return out


def _evaluations(run: Path):
    """(name, first-draw rows) per held-out evaluation, in training order."""
    files = sorted((run / "eval").glob("*.jsonl"), key=lambda p: (
        p.stem != "before_rl", p.stem.startswith("after"), p.stem))
    for path in files:
        yield path.stem, [r for r in map(json.loads, path.read_text().splitlines())
                          if r.get("draw", 0) == 0]


def _rollouts(run: Path):
    """("step N", that step's logged samples) per logged RL step."""
    steps: dict[int, list[dict]] = {}
    for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines()):
        steps.setdefault(r["step"], []).append(r)
    for step in sorted(steps):
        yield f"step {step} (samples)", steps[step]


def report(run: Path, halves: bool, rollouts: bool = False) -> None:
    ratio = _looked_at_ratio(run)
    print(f"== {run}")
    for name, rows in (_rollouts(run) if rollouts else _evaluations(run)):
        if not rows:
            continue
        s = summarise(rows, ratio, halves)
        firsts = ", ".join(f"{t[:28]!r} x{n}" for t, n in s["first_turns"].most_common(3))
        line = (f"{name:32s} metric {s['metric']:.2f}  found {s['found']}/{s['records']}  "
                f"right when found {s['right_when_found']:g}  turn cap {s['hit_turn_cap']}  "
                f"first: {firsts}  answers {dict(s['answers'])}")
        if halves and s.get("card_half"):
            line += (f"  card halves {dict(s['card_half'])}, right by half "
                     f"{ {k: round(v, 2) for k, v in s['right_by_half'].items()} }")
        print(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--halves", action="store_true",
                    help="split video records by the half of the clip their card starts in")
    ap.add_argument("--rollouts", action="store_true",
                    help="the sampled trajectories of RUN/rollouts.jsonl, per logged step")
    args = ap.parse_args(argv)
    for run in args.runs:
        report(run, args.halves, args.rollouts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
