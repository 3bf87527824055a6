"""`mmrl bench --which long` at quick sizes (it launches torchrun for SP=1 and SP=2): the
token-budget plan runs fewer forwards for the same loss, the cached frozen encoder runs less,
both SP sizes report per-rank memory, and the tables render."""
from __future__ import annotations

import pytest

from mmrl.bench import run_benchmarks

pytestmark = pytest.mark.integration


def test_quick_long_benchmark(tmp_path):
    results = run_benchmarks(tmp_path, which=("long",), quick=True, log=lambda *_: None)
    long = results["long"]
    (sp_row,) = long["sp"]["rows"]
    assert sp_row["sp1"]["peak_mb"] > 0 and sp_row["sp2"]["peak_mb"] > 0
    for cell in long["micro_batches"]["cells"]:
        rows, tokens = cell["rows"], cell["tokens"]
        assert tokens["forwards"] < rows["forwards"]
        assert tokens["largest_forward_tokens"] <= rows["largest_forward_tokens"]
        assert tokens["loss"] == pytest.approx(rows["loss"], abs=1e-6)
    cache = long["encoder_cache"]
    assert cache["cache_reason"].startswith("vision encoder output cached")
    assert cache["cached"]["encoder_s"] < cache["every forward"]["encoder_s"]
    text = (tmp_path / "bench.md").read_text()
    assert "SP=2 peak MB per rank" in text and "token budget" in text and "encoder s per step" in text
