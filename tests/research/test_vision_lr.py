"""research/probes/vision_lr.py, run as its users run it: plain transformers training of a tiny
family model on one-object images (no mmrl training code)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # 100 training steps in a subprocess
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "research" / "probes" / "vision_lr.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _run(cmd) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_probe_vision_lr_learns_colour_at_1e4():
    # The learning table's finding in one short run: at lr 1e-4 the tiny Qwen2.5-VL reads colour.
    proc = _run([sys.executable, SCRIPT, "--what", "colour", "--lr", "1e-4",
                 "--steps", "100"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = [line for line in proc.stdout.splitlines() if line.startswith("step 100")][0]
    assert float(last.split("val accuracy")[1]) >= 0.9, proc.stdout
