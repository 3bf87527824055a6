"""Do finished learning-table runs hold on a second held-out draw?

A row's cells are read on 100 held-out records, so a control that is blind still moves by the
draw: a 4-way guess that varies with the record scores 0.25 +- 0.043 (one standard error), and
ends above the table's band of 0.05 around chance one time in ten (`blind_band`). This probe takes the runs the table already trained
(runs/learning/ROW_sSEED, settings and weights unchanged), draws the row's held-out records
again from another seed (learning_table.prepare_generated; generated rows only) and evaluates
with `mmrl eval`, as a user would:

- after RL: the run's last checkpoint, with the shuffled-media control when the run has it;
- before RL: the run's `reference` folder where it kept one (the warm-up's weights, which the
  KL is taken against; a run with algo.beta 0 keeps none, and one with algo.ref_reset_every
  refreshes it: their before cell reads "-").

    python research/probes/second_draw.py --rows video_search,video_search_no_tool \
        --seeds 0,1,2,3,4 --eval-seed 202 [--out research/second_draw_202.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research"))


def mmrl_eval(run: Path, checkpoint: Path, eval_file: Path, shuffled: bool) -> dict:
    """`mmrl eval` of `checkpoint` with `run`'s own config on `eval_file` -> its metrics (run as
    the learning table runs the CLI: learning_table._mmrl, its output in a log)."""
    import learning_table as lt

    with tempfile.TemporaryDirectory() as out:
        lt._mmrl(["eval", str(run / "config.yaml"), f"data.eval={eval_file}",
                  f"eval.shuffled_images={str(shuffled).lower()}",
                  "--checkpoint", str(checkpoint), "--out", out], Path(out) / "eval.log")
        return json.loads((Path(out) / "metrics.json").read_text())


def cell(run: Path, eval_file: Path) -> dict:
    """{"before", "after", "shuffled", "n"} of one finished run on `eval_file`."""
    from mmrl import config

    cfg = config.load(str(run / "config.yaml"))
    after = mmrl_eval(run, run, eval_file, cfg.eval.shuffled_images)
    reference = run / "reference"  # refreshed during RL under algo.ref_reset_every: not "before"
    before = (mmrl_eval(run, reference, eval_file, False)
              if reference.is_dir() and not cfg.algo.ref_reset_every else None)
    return {"before": before["accuracy"] if before else None, "after": after["accuracy"],
            "shuffled": after.get("accuracy_shuffled_images"), "n": after["n"]}


def blind_band(n: int, chance: float = 0.25, band: float = 0.05) -> dict:
    """A blind guess that varies with the record, on `n` balanced records: its reading's
    standard error, and the probability it ends above `chance + band` (binomial)."""
    over = math.floor(n * (chance + band) + 1e-9) + 1  # the fewest right answers past the band
    above = sum(math.comb(n, k) * chance ** k * (1 - chance) ** (n - k) for k in range(over, n + 1))
    return {"se": math.sqrt(chance * (1 - chance) / n), "above": above}


def table(results: dict, eval_seed: int) -> str:
    def f(x):
        return "-" if x is None else f"{x:.2f}"

    lines = [f"eval seed {eval_seed}", "| row | seed | n | before | after | shuffled |",
             "|---|---|---|---|---|---|"]
    for row, seeds in results.items():
        for seed, c in seeds.items():
            lines.append(f"| {row} | {seed} | {c['n']} | {f(c['before'])} | {f(c['after'])} | "
                         f"{f(c['shuffled'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import learning_table as lt

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", required=True)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--eval-seed", type=int, required=True)
    p.add_argument("--runs", default=str(ROOT / "runs" / "learning"))
    p.add_argument("--data", default=str(ROOT / "data" / "learning"))
    p.add_argument("--out", default=None, help="also write the cells as JSON here")
    args = p.parse_args(argv)
    runs, data = Path(args.runs), Path(args.data)
    results: dict = {}
    for row in args.rows.split(","):
        if row not in lt.GENERATED:
            raise SystemExit(f"second_draw: {row} is not a generated row (learning_rows.GENERATED)")
        _, eval_file = lt.prepare_generated(row, data, data / f"{row}_draw.log", args.eval_seed)
        for seed in (int(s) for s in args.seeds.split(",")):
            run = lt._run_dir(row, seed, runs)
            if not (run / "config.yaml").is_file():
                raise SystemExit(f"second_draw: no finished run at {run}; run the row first "
                                 f"(bash research/learning_table.sh --rows {row} --seeds {seed})")
            results.setdefault(row, {})[seed] = cell(run, eval_file.resolve())
            print(f"{row} seed {seed}: {results[row][seed]}", flush=True)
    print(table(results, args.eval_seed))
    n = max(c["n"] for seeds in results.values() for c in seeds.values())
    blind = blind_band(n)
    print(f"a blind 4-way guess on {n} records: 0.25 +- {blind['se']:.3f}; above the 0.05 band "
          f"with probability {blind['above']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"eval_seed": args.eval_seed, "cells": results},
                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
