"""`scripts/gpu_check.sh --cpu`: every stage of the GPU check runs at tiny sizes on the CPU and
writes its report, so the script a lent GPU runs in one go has not rotted."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_dry_run_writes_every_section(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu", "--out",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu.json").read_text())
    stages = results["stages"]
    assert not [name for name, s in stages.items() if "failure" in s], \
        {name: s["failure"] for name, s in stages.items() if "failure" in s}
    for kernel, row in stages["correctness"]["kernels"].items():
        assert row["ok"], (kernel, row)
    for cell in stages["update"]["cells"]:
        assert all(cell[layout]["seconds"] > 0 for layout in ("naive", "shared", "varlen"))
    gen = stages["generation"]
    assert gen["hf_generate"]["tokens_per_s"] > 0 and gen["shared"]["tokens_per_s"] > 0
    step = stages["grpo step"]
    assert step["stages"]["step"] > 0 and step["measured_peak"] > 0
    assert 0.7 < step["predicted_peak"] / step["measured_peak"] < 1.3
    trl = stages["trl"]
    assert "skipped" in trl or trl["ratio"] > 0
    text = (tmp_path / "gpu.md").read_text()
    for title in ("## Environment", "## Correctness on the device", "## Update phase",
                  "## Generation", "## One full GRPO step", "## TRL"):
        assert title in text
    assert "CPU dry run" in text
