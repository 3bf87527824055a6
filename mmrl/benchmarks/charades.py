"""Charades-STA test, as lmms-eval's `temporal_grounding_charades`: its instruction with the
worked example, the sentence, "Please return its start time and end time."; lmms-eval's time
extractor (ranges "a - b", "mm:ss", numbers, in that order; exactly one interval, else IoU 0);
R@{0.3, 0.5, 0.7} (IOU@3/5/7) and mIoU in percent. Rows with the same video, sentence and
interval count once, the last prediction kept (lmms-eval merges them into one dict)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, write_parquet
from mmrl.types import Sample

PRE = ("Please find the visual event described by a sentence in the video, determining its "
       "starting and ending times. The format should be: 'The event happens in the start time - "
       "end time'. For example, The event 'person turn a light on' happens in the 24.3 - 30.4 "
       "seonds. Now I will give you the textual sentence: ")
POST = "Please return its start time and end time."


def prompt(row: dict) -> str:
    return f"{PRE}{row['caption']}. {POST}"


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return Sample(id=f"{row['video']}>>>{row['caption']}", messages=chat(prompt(row), videos=1),
                  solution=_gt(row["timestamp"]), task="charades", source=source,
                  videos=[str(root / "Charades_v1_480" / row["video"])])


def _gt(raw) -> tuple[float, float]:
    raw = ast.literal_eval(raw) if isinstance(raw, str) else raw
    return float(raw[0]), float(raw[1])


def _seconds(stamp: str) -> float:
    parts = [float(p) for p in stamp.split(":")]
    return parts[0] * 3600 + parts[1] * 60 + parts[2] if len(parts) == 3 else \
        parts[0] * 60 + parts[1]


_CLOCK_RANGE = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\s*[–-]\s*(\d{1,2}:\d{2}(?::\d{2})?)\b")
_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)\b")
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\b")
_LOOSE = re.compile(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?")
KEYWORDS = ["starts", "ends", "happens in", "start time", "end time", "start", "end", "happen"]


def _pairs(times: list[float]) -> list[tuple[float, float]]:
    times = times[:len(times) // 2 * 2]
    return [(times[i], times[i + 1]) for i in range(0, len(times), 2)]


def extract_time(text: str) -> list[list[float]]:
    """lmms-eval's `extract_time`: the first interval found, ordered, in a list (or [])."""
    text = text.lower().replace("a specific example is : 20.8 - 30.0 seconds", "")
    sentences = re.split(r"[!?\n]", text.replace("to", "-"))
    sentences = [s for s in sentences if any(k in s for k in KEYWORDS)] or sentences
    found: list = []
    for pattern, cast in ((_CLOCK_RANGE, _seconds), (_RANGE, float)):
        for s in sentences:
            if pattern.findall(s):
                found = [[cast(a), cast(b)] for a, b in pattern.findall(s)]
                break
        if found:
            break
    if not found:
        found = _pairs([_seconds(t) for s in sentences for t in _CLOCK.findall(s)])
    if not found:
        found = _pairs([float(_NUMBER.findall(s)[0]) for s in sentences if _NUMBER.findall(s)])
    if not found:
        found = next(([[float(a), float(b)] for a, b in _LOOSE.findall(s)]
                      for s in sentences if _LOOSE.findall(s)), [])
    return [[a, b] if b > a else [b, a] for a, b in found[:1]]


def iou(a, b) -> float:
    """Temporal IoU as lmms-eval computes it (the hull as the union)."""
    denom = max(a[1], b[1]) - min(a[0], b[0])
    return 0.0 if denom <= 0 else max(min(a[1], b[1]) - max(a[0], b[0]), 0) / denom


def score(row: dict, text: str, ctx: Context) -> dict:
    times = extract_time(text)
    value = iou(_gt(row["timestamp"]), times[0]) if len(times) == 1 else 0.0
    return {"key": f"{row['video']}>>>{row['caption']}>>>{row['timestamp']}", "pred": times,
            "iou": value}


def aggregate(rows: list[dict]) -> dict:
    kept = list({r["key"]: r for r in rows}.values())  # one per key, the last one
    ious, n = [r["iou"] for r in kept], len(kept)
    out = {f"R@{t}": (sum(v >= t for v in ious) * 100 / n if n else 0) for t in (0.3, 0.5, 0.7)}
    return {**out, "mIoU": sum(ious) * 100 / n if n else 0}


def write_fixture(root: Path, n: int, seed: int) -> None:
    """data/test-00000-of-00001.parquet (video: file name, caption, timestamp [start, end] in
    seconds) and Charades_v1_480/NAME.mp4 (2 s at 8 fps)."""
    import numpy as np

    from mmrl.data.synthetic_av import write_mp4

    rows = []
    for i in range(n):
        name = f"FX{i:03d}.mp4"
        frames = np.random.default_rng(seed + i).integers(0, 255, (16, 32, 32, 3), dtype=np.uint8)
        (root / "Charades_v1_480").mkdir(parents=True, exist_ok=True)
        write_mp4(root / "Charades_v1_480" / name, frames, 8)
        rows.append({"video": name, "caption": f"person opens door number {i}",
                     "timestamp": [round(0.1 * (i % 7), 1), round(0.8 + 0.1 * (i % 9), 1)]})
    write_parquet(root / "data" / "test-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="charades", title="Charades-STA test, temporal grounding", hub="lmms-lab/charades_sta",
    lmms_task="temporal_grounding_charades", files="data/test-*.parquet", metric="mIoU",
    to_sample=to_sample, score=score, aggregate=aggregate, write_fixture=write_fixture,
    max_new_tokens=50, notes="videos from Charades_v1_480/ (the Charades 480p release)")
