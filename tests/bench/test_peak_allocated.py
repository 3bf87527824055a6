"""The tensor-memory meter of `mmrl bench --which long` counts what is allocated inside it, not
what existed before (the quick benchmark itself: tests/integration/test_long_bench.py)."""
from __future__ import annotations

import pytest
import torch

from mmrl.bench.common import PeakAllocated


def test_peak_allocated_counts_tensors_made_inside():
    before = torch.zeros(4 * 2**20, dtype=torch.uint8)  # 4 MB that existed before: not counted
    with PeakAllocated() as mem:
        a = torch.ones(8 * 2**20, dtype=torch.uint8)  # 8 MB
        b = a + 1  # +8 MB: the peak
        del a, b
        c = torch.ones(2 * 2**20, dtype=torch.uint8)
    assert mem.extra == pytest.approx(16 * 2**20, rel=0.01)
    assert before.numel() and c.numel()

