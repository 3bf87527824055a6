"""WebDataset shards at scale: records/s and peak RSS of reading N samples (a ~120-byte native
record + a 56x56 PNG member each) from a folder of `.tar` shards, each in a fresh process.
    OMP_NUM_THREADS=1 python scripts/bench_webdataset.py --samples 100000 --shards 10
Rows: `open` (load_samples on the folder: every shard's tar headers scanned, the first record
read for the format rule), `draw` (open, then every sample adapted in a shuffled order, as the
prompt sampler draws them: its JSON parsed, its image member written to the embedded-media folder,
the Sample built) and `inspect` (`mmrl data inspect DIR`: every sample adapted and its image
header opened). records/s counts the samples of the phase after opening; peak RSS is the whole
process's (VmHWM), torch's import included (mmrl.types imports it): `import_rss_mb` is the
resident size after the imports, before the shards are opened. `inspect` records/s is over its
whole wall time, imports included. `--what raw,webdataset` adds the bare read of every sample's
member bytes in shard order, by ShardTable and by the `webdataset` package (when importable;
not a dependency of mmrl), which reads shards only in order.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()


def write_shards(folder: Path, n: int, shards: int) -> int:
    """n samples over `shards` tar files, members as webdataset's TarWriter writes them."""
    from PIL import Image

    folder.mkdir(parents=True)
    per = -(-n // shards)
    for s in range(shards):
        with tarfile.open(folder / f"shard-{s:06d}.tar", "w") as tf:
            for i in range(s * per, min(n, (s + 1) * per)):
                buf = io.BytesIO()  # a distinct image per sample: no write is deduplicated
                Image.new("RGB", (56, 56), (i % 256, (i // 256) % 256, 0)).save(buf, "PNG")
                record = {"task": "counting", "prompt": "How many red squares are in the "
                          "picture? Answer with <answer>N</answer>.", "solution": str(i % 4 + 1)}
                for name, data in ((f"{i:07d}.json", json.dumps(record).encode()),
                                   (f"{i:07d}.png", buf.getvalue())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return sum(f.stat().st_size for f in folder.iterdir())


def _rss_mb(field: str = "VmHWM") -> float:
    """VmHWM (peak) or VmRSS (now) of this process, as mmrl.bench.common.peak_rss_bytes reads
    it (that module imports torch, which this script's `open` row need not)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def child(what: str, folder: Path) -> dict:
    """One measurement in this (fresh) process."""
    out: dict = {"what": what}
    if what == "inspect":
        import contextlib

        from mmrl import cli

        with contextlib.redirect_stdout(io.StringIO()):
            out["exit"] = cli.main(["data", "inspect", str(folder), "--show", "0"])
        out["records_per_s"] = None
    elif what == "webdataset":
        import webdataset as wds

        shards = [str(p) for p in sorted(folder.glob("*.tar"))]
        start = time.perf_counter()
        n = sum(1 for _ in wds.WebDataset(shards, shardshuffle=False))
        took = time.perf_counter() - start
        out.update(read_s=round(took, 2), records_per_s=round(n / took))
    elif what == "raw":
        from mmrl.data.webdataset import ShardTable

        out["import_rss_mb"] = _rss_mb("VmRSS")
        start = time.perf_counter()
        table = ShardTable(sorted(folder.glob("*.tar")))
        out["open_s"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        n = sum(1 for i in range(len(table)) if table.member_bytes(i))
        took = time.perf_counter() - start
        out.update(read_s=round(took, 2), records_per_s=round(n / took))
    else:
        from mmrl.data.schema import load_samples

        out["import_rss_mb"] = _rss_mb("VmRSS")
        start = time.perf_counter()
        samples = load_samples(folder)
        out["open_s"] = round(time.perf_counter() - start, 2)
        if what == "draw":
            order = list(range(len(samples)))
            random.Random(0).shuffle(order)
            start = time.perf_counter()
            images = sum(len(samples[i].images) for i in order)
            took = time.perf_counter() - start
            out.update(draw_s=round(took, 2), records_per_s=round(len(order) / took),
                       images=images)
    return {**out, "wall_s": round(time.perf_counter() - STARTED, 2),
            "peak_rss_mb": _rss_mb()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--what", default="open,draw,inspect")
    ap.add_argument("--out", default="runs/bench_webdataset.json")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(args._child[0], Path(args._child[1]))))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "shards"
        size = write_shards(folder, args.samples, args.shards)
        for what in args.what.split(","):
            path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1",
                   "MMRL_EMBEDDED_DIR": str(Path(tmp) / f"embedded_{what}")}
            proc = subprocess.run([sys.executable, __file__, "--_child", what, str(folder)],
                                  capture_output=True, text=True, env=env, cwd=tmp)
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            row = {"samples": args.samples, "shards": args.shards,
                   "shards_mb": round(size / 2**20, 1),
                   **json.loads(proc.stdout.strip().splitlines()[-1])}
            if what == "inspect":
                row["records_per_s"] = round(args.samples / row["wall_s"])
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
