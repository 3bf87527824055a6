"""Measured peak memory per stage (mmrl/train/memory.py): on CPU the resident set's high-water
mark, reset as each stage starts, so a stage that holds a large tensor reads it and the next
stage does not; the run summary puts the plan's prediction beside it."""
from __future__ import annotations

import pytest
import torch

from mmrl.train import memory

MB = 2 ** 20


def test_each_stage_reads_its_own_peak_and_the_run_keeps_the_largest():
    peaks = memory.PhasePeaks(cuda=False)
    if not peaks.working:
        pytest.skip("no /proc/self/clear_refs on this platform")
    with peaks("big"):
        x = torch.ones(64 * MB // 4)  # 64 MB, touched
        del x
    with peaks("small"):
        pass
    step = peaks.metrics()
    assert step["memory/big_gib"] * 1024 - step["memory/small_gib"] * 1024 > 48  # MB
    assert peaks.metrics() == {}  # the next step starts empty; the run keeps its peaks
    s = memory.summary(peaks, {"big": 2 * 2 ** 30, "update": 2 ** 30})
    assert s["measured"] == "cpu resident set (VmHWM)"
    assert s["stages"]["big"]["predicted_gib"] == 2.0
    assert s["stages"]["big"]["measured_gib"] == round(peaks.run["big"] / 2 ** 30, 3)
    assert s["stages"]["update"] == {"measured_gib": None, "predicted_gib": 1.0}
    rows = dict(memory.summary_rows(s))
    assert rows["peak memory big"].endswith(" GiB (plan 2.00)")
    assert rows["peak memory update"] == "- (plan 1.00)"
