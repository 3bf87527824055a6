"""Decoded-media cache benchmark: decode N videos + N audio tracks twice (cold, then warm).

    python scripts/bench_media_cache.py --n 16 --out runs/bench_media_cache.json

Each item is an mp4 (H.264 video at --size px, --seconds long at 24 fps, with a 44.1 kHz stereo
AAC track), loaded the way training loads it: frames sampled at 2 fps within a pixel budget, and
its audio track resampled to 16 kHz mono. Epoch 1 decodes and fills the cache; epoch 2 should
decode nothing (counted) and only read .npz files. Prints and writes JSON with the speed-up.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from mmrl.data.cache import MediaCache
from mmrl.data.media import load_audio, load_video
from mmrl.data.synthetic_av import write_mp4


def make_assets(root: Path, n: int, size: int, seconds: float, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    fps, sr = 24, 44100
    paths = []
    for i in range(n):
        t = int(seconds * fps)
        base = rng.integers(0, 255, (size // 8, size // 8, 3), dtype=np.uint8)
        frames = np.stack([np.roll(np.kron(base, np.ones((8, 8, 1), np.uint8)), 2 * k, axis=1)
                           for k in range(t)])  # textured, moving: a real decode workload
        tt = np.arange(int(seconds * sr)) / sr
        audio = 0.3 * np.sin(2 * np.pi * (220 + 20 * i) * tt)
        path = root / f"clip{i:03d}.mp4"
        write_mp4(path, frames, fps, audio=np.stack([audio, 0.5 * audio], axis=1), sr=sr)
        paths.append(path)
    return paths


def epoch(paths: list[Path], cache: MediaCache | None, max_pixels: int) -> float:
    t0 = time.perf_counter()
    for p in paths:
        load_video(str(p), fps=2.0, max_total_pixels=max_pixels, cache=cache)
        load_audio(str(p), sr=16000, cache=cache)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="number of videos (each with an audio track)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--max-total-pixels", type=int, default=16 * 224 * 224)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_media_cache.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = make_assets(root, args.n, args.size, args.seconds, args.seed)
        epoch(paths[:1], None, args.max_total_pixels)  # warm imports / page cache
        no_cache = epoch(paths, None, args.max_total_pixels)
        cache = MediaCache(root / "cache")
        cold = epoch(paths, cache, args.max_total_pixels)
        misses_cold = cache.misses
        warm = epoch(paths, cache, args.max_total_pixels)
        result = {
            "n_videos": args.n, "n_audios": args.n, "size": args.size, "seconds": args.seconds,
            "no_cache_s": round(no_cache, 4), "cold_s": round(cold, 4), "warm_s": round(warm, 4),
            "speedup_warm_vs_cold": round(cold / warm, 2),
            "speedup_warm_vs_no_cache": round(no_cache / warm, 2),
            "decodes_epoch1": misses_cold, "decodes_epoch2": cache.misses - misses_cold,
            "hits_epoch2": cache.hits, "cache_bytes": cache.stats()["bytes"],
        }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
