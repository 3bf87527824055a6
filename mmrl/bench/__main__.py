"""`mmrl bench` (or `python -m mmrl.bench`): how much faster the shared-prefix layout makes a
multimodal GRPO step, and a whole step against TRL's GRPOTrainer (docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import os

from mmrl.bench import BENCHMARKS, run_benchmarks


def main(argv=None) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads skew timings
    parser = argparse.ArgumentParser(prog="mmrl bench", description=__doc__.replace("\n", " "))
    parser.add_argument("--out", default="runs/bench", help="output dir (bench.json, bench.md, scaling.png)")
    parser.add_argument("--which", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one trial (smoke run)")
    parser.add_argument("--trials", type=int, default=None, help="trials per configuration")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--family", default="qwen2_5_vl", help="tiny model family (mmrl ls models)")
    args = parser.parse_args(argv)
    run_benchmarks(args.out, which=tuple(w for w in args.which.split(",") if w), quick=args.quick,
                   trials=args.trials, threads=args.threads, family=args.family)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
