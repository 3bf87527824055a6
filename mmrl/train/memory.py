"""Measured peak memory per stage of a step, beside the memory plan's prediction (docs/memory.md).

On CUDA a stage's peak is `torch.cuda.max_memory_allocated` with the peak reset as the stage
starts: bytes of live tensors, what the plan predicts. On CPU it is the process's resident-set
high-water mark (VmHWM, reset through /proc/self/clear_refs; Linux only): every byte of the
process, the interpreter and libraries included, so it is larger than the plan's tensors.

run.py installs one `PhasePeaks` on the Trainer (`trainer.memory`); the benchmarks that build a
Trainer themselves leave it off, since each reset would cut the whole-run peak they read.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

GIB = 2 ** 30


def _cuda_reset() -> None:
    torch.cuda.reset_peak_memory_stats()


def _cuda_peak() -> int:
    return torch.cuda.max_memory_allocated()


def _rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # 5: reset the high-water mark to the current resident set


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # kB


# device kind -> (what is measured, reset, read)
MEASURES = {True: ("cuda max_memory_allocated", _cuda_reset, _cuda_peak),
            False: ("cpu resident set (VmHWM)", _rss_reset, _rss_peak)}


class PhasePeaks:
    """`with peaks("update"): ...` records the stage's peak; `metrics()` gives this step's peaks
    (`memory/<stage>_gib`) and starts the next step's; `run` keeps the largest of the run."""

    def __init__(self, cuda: bool):
        self.measure, self._reset, self._read = MEASURES[cuda]
        self.step: dict[str, int] = {}
        self.run: dict[str, int] = {}
        self.working = True
        try:  # /proc is Linux's: elsewhere the CPU peak is not measured
            self._reset()
        except OSError:
            self.working = False

    @contextmanager
    def __call__(self, stage: str):
        if not self.working:
            yield
            return
        self._reset()
        try:
            yield
        finally:
            peak = self._read()
            self.step[stage] = max(self.step.get(stage, 0), peak)
            self.run[stage] = max(self.run.get(stage, 0), peak)

    def metrics(self) -> dict[str, float]:
        out = {f"memory/{stage}_gib": peak / GIB for stage, peak in self.step.items()}
        self.step = {}
        return out


def summary(peaks: PhasePeaks | None, predicted: dict[str, float] | None) -> dict:
    """summary.json's `memory`: per stage the run's measured peak and the plan's prediction
    (GiB; None where there is none: a CPU run, or a plan that could not be made)."""
    if peaks is None:
        return {}
    predicted = predicted or {}
    stages = list(peaks.run) + [s for s in predicted if s not in peaks.run]
    return {"measured": peaks.measure if peaks.working else "not measured on this platform",
            "stages": {s: {"measured_gib": _gib(peaks.run.get(s)),
                           "predicted_gib": _gib(predicted.get(s))} for s in stages}}


def summary_rows(memory: dict) -> list[tuple[str, str]]:
    """Rows of the printed end-of-run summary: `peak memory update | 41.2 GiB (plan 48.6)`."""
    rows = []
    for stage, v in (memory.get("stages") or {}).items():
        measured, predicted = v["measured_gib"], v["predicted_gib"]
        if measured is None and predicted is None:
            continue
        text = "-" if measured is None else f"{measured:.2f} GiB"
        text += "" if predicted is None else f" (plan {predicted:.2f})"
        rows.append((f"peak memory {stage}", text))
    return rows


def _gib(x: float | None) -> float | None:
    return None if x is None else round(x / GIB, 3)
