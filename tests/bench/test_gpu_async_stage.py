"""The GPU check's async stage (mmrl/bench/gpu_check.py `async_step`, docs/gpu.md's "k = 0 vs
k = 1" section) at the tiny twin's sizes: the code path a lent GPU runs at the qwen2_5_vl-3b
shape, each k a real Trainer in its own process (k = 1 with its sampler process)."""
from __future__ import annotations

import pytest

from mmrl.bench import gpu_check, gpu_report

pytestmark = pytest.mark.integration


def test_async_step_measures_k0_and_k1_and_renders_their_ratio(tmp_path):
    s = gpu_check.sizes(cpu=True)
    out = gpu_check.async_step(True, s, tmp_path)
    assert out["steps"] == s["step"]["steps"] + 1 and out["steps_timed"] == out["steps"] - 1
    for k in ("k0", "k1"):
        run = out[k]
        assert len(run["step_s"]) == out["steps_timed"] and min(run["step_s"]) > 0
        # steps/s: the timed steps over the sum of their wall times
        assert run["steps_per_s"] == pytest.approx(len(run["step_s"]) / sum(run["step_s"]))
        assert 0 < run["update_s"] < max(run["step_s"])
    assert out["ratio"] == pytest.approx(out["k1"]["steps_per_s"] / out["k0"]["steps_per_s"])
    assert "rollout.max_staleness=1" not in out["overrides"]
    # Each k ran its own config: k = 1's batches came from the sampler, at most 1 version old.
    assert out["k0"]["staleness"] == [None] * out["steps"]
    assert all(v in (0.0, 1.0) for v in out["k1"]["staleness"])
    text = "\n".join(gpu_report._async(out, {"cpu": True}))
    assert f"| 1 | {out['k1']['steps_per_s']:.3f} |" in text
    assert f"x{out['ratio']:.2f} steps/s" in text
