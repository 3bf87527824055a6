"""Dataset startup benchmark: time and peak RSS until the first prompts can be drawn from a large
Parquet file with embedded images, streaming (mmrl now) vs reading the table whole (before).
    python scripts/bench_data_load.py --n 100000 --out runs/bench_data_load.json
Writes --n EasyR1-layout rows (problem/answer/images with PNG bytes, 1000-row row groups) once,
then in a fresh process per mode: `eager` = what mmrl did before (pq.read_table().to_pylist(),
every record adapted, every embedded image written out at load), `stream` = load_samples() and
the block-shuffled sampler; both then draw --draw samples. Prints and writes JSON.
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install


def write_parquet(path: Path, n: int, size: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)
    pngs = []
    for _ in range(256):  # distinct noise images, reused: the file is big, its writing quick
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
        pngs.append(buf.getvalue())
    schema = pa.schema([("problem", pa.string()), ("answer", pa.string()),
                        ("images", pa.list_(pa.struct([("bytes", pa.binary()),
                                                       ("path", pa.string())])))])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as w:
        for start in range(0, n, 1000):
            rows = [{"problem": f"<image>How many? ({i})", "answer": str(i % 4 + 1),
                     "images": [{"bytes": pngs[i % 256], "path": None}]}
                    for i in range(start, min(n, start + 1000))]
            w.write_table(pa.Table.from_pylist(rows, schema), row_group_size=1000)


def measure(mode: str, path: Path, draw: int) -> dict:
    from mmrl.bench.common import peak_rss_bytes
    from mmrl.data import formats
    from mmrl.data.schema import load_samples
    from mmrl.train.prompts import PromptSampler

    t0 = time.perf_counter()
    if mode == "eager":
        import pyarrow.parquet as pq

        samples = [formats.FORMATS.get("easyr1")(r, f"{path}[{i}]", path.parent)
                   for i, r in enumerate(pq.read_table(path).to_pylist())]
    else:
        samples = load_samples(path, fmt=None)
    sampler = PromptSampler(len(samples), seed=0, blocks=getattr(samples, "blocks", None))
    ready = time.perf_counter() - t0
    drawn = [samples[sampler.next()] for _ in range(draw)]
    return {"mode": mode, "records": len(samples), "startup_s": round(ready, 2),
            "first_draws_s": round(time.perf_counter() - t0 - ready, 3), "drawn": len(drawn),
            "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=56, help="image side in pixels")
    ap.add_argument("--draw", type=int, default=64, help="samples drawn after startup")
    ap.add_argument("--modes", default="stream,eager")
    ap.add_argument("--out", default="runs/bench_data_load.json")
    ap.add_argument("--_measure", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._measure:  # child process: one mode, its own peak RSS
        print(json.dumps(measure(args._measure[0], Path(args._measure[1]), args.draw)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.parquet"
        write_parquet(path, args.n, args.size)
        result = {"n": args.n, "size": args.size, "file_mb": round(path.stat().st_size / 2**20, 1)}
        for mode in args.modes.split(","):
            env_embedded = Path(tmp) / f"embedded_{mode}"
            proc = subprocess.run([sys.executable, __file__, "--draw", str(args.draw),
                                   "--_measure", mode, str(path)], capture_output=True, text=True,
                                  env={**__import__("os").environ,
                                       "MMRL_EMBEDDED_DIR": str(env_embedded)})
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["images_written"] = len(list(env_embedded.iterdir())) if env_embedded.exists() else 0
            result[mode] = res
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
