"""JSONL at scale: peak RSS and time of `mmrl data inspect FILE` and of a 3-step `mmrl train` on
1k / 100k / 1M native records (~280 bytes each, one shared 56x56 image), each in a fresh process.
    python scripts/bench_data_scale.py --sizes 1000,100000,1000000 --out runs/bench_data_scale.json
`--code DIR` runs the measured processes on another checkout (e.g. the main branch before
JSONL was read by offset), for a before/after table. The training run is the quickstart recipe
on the tiny model without eval or warm-up: 3 steps of 4 prompts x 4 completions. `startup_s` is
the time from the process start until the trainer is built (data loaded and checked, model
built), `wall_s` the whole command.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()


def write_records(path: Path, n: int) -> None:
    from PIL import Image

    Image.new("RGB", (56, 56), (255, 255, 255)).save(path.parent / "square.png")
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"cnt-{i:07d}", "task": "counting",
                                "prompt": f"How many red squares are in the picture? Answer "
                                          f"with <answer>N</answer>. (record {i})",
                                "images": ["square.png"], "solution": str(i % 4 + 1)}) + "\n")


def child(what: str, path: Path, run_dir: Path) -> dict:
    """One measurement in this (fresh) process."""
    import contextlib
    import io

    from mmrl import cli
    from mmrl.bench.common import peak_rss_bytes

    built = {}
    if what == "train":
        from mmrl.train import loop

        init = loop.Trainer.__init__

        def timed_init(self, *a, **kw):
            init(self, *a, **kw)
            built["startup_s"] = round(time.perf_counter() - STARTED, 2)

        loop.Trainer.__init__ = timed_init
        argv = ["train", str(ROOT / "recipes" / "quickstart.yaml"), f"data.train={path}",
                "data.eval=null", "data.generate=null", "sft.steps=0", "train.steps=3",
                "train.warmup_steps=0", "rollout.prompts_per_step=4",
                "rollout.num_generations=4", "log.progress=off", "log.tensorboard=false",
                "eval.shuffled_images=false", f"log.run_dir={run_dir}"]
    else:
        argv = ["data", "inspect", str(path), "--show", "0"]
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return {"what": what, "exit": code, **built,
            "wall_s": round(time.perf_counter() - STARTED, 2),
            "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--what", default="inspect,train")
    ap.add_argument("--code", default=str(ROOT), help="checkout whose mmrl is measured")
    ap.add_argument("--out", default="runs/bench_data_scale.json")
    ap.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(args._child[0], Path(args._child[1]), Path(args._child[2]))))
        return 0
    env = {**os.environ, "PYTHONPATH": args.code, "HF_HUB_OFFLINE": "1"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(s) for s in args.sizes.split(",")]:
            path = Path(tmp) / f"n{n}" / "train.jsonl"
            path.parent.mkdir()
            write_records(path, n)
            for what in args.what.split(","):
                proc = subprocess.run([sys.executable, __file__, "--_child", what, str(path),
                                       str(path.parent / f"run_{what}")], capture_output=True,
                                      text=True, env=env, cwd=tmp)
                if proc.returncode:
                    raise SystemExit(proc.stderr[-3000:])
                row = {"records": n, "file_mb": round(path.stat().st_size / 2**20, 1),
                       "code": args.code, **json.loads(proc.stdout.strip().splitlines()[-1])}
                print(json.dumps(row), flush=True)
                rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
