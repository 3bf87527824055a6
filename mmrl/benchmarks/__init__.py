"""The field's benchmarks, read from local Hub copies, prompted and scored as lmms-eval's tasks
do (docs/benchmarks-eval.md). `BENCHMARKS`: name -> Benchmark; runner.py runs one."""
from __future__ import annotations

from mmrl.benchmarks import charades, hrbench, mathvista, mmau, mmmu, refcoco, videomme, vstar
from mmrl.benchmarks.base import Benchmark, MissingCopy

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    refcoco.BENCHMARK, mmau.BENCHMARK, vstar.BENCHMARK, mathvista.BENCHMARK, mmmu.BENCHMARK,
    videomme.BENCHMARK, videomme.BENCHMARK_SUBTITLES, charades.BENCHMARK,
    hrbench.BENCHMARK)}


def get(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


__all__ = ["BENCHMARKS", "Benchmark", "MissingCopy", "get"]
