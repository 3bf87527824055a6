"""The quickstart's promise, as a user runs it (README): held-out accuracy ends at >= 0.9 after
RL, >= 0.15 above the warmed-up model, with images shuffled across samples it falls to chance
(the model reads pixels), and the run ends cleanly, without a warning. A few minutes on 2 cores.
Seed 0 here; seeds 0-4 are in docs/learning.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_learns_from_pixels(tmp_path):
    run_dir = tmp_path / "quickstart"
    cmd = [sys.executable, "-m", "mmrl.cli", "train", str(ROOT / "recipes" / "quickstart.yaml"),
           f"log.run_dir={run_dir}", "log.tensorboard=false"]
    done = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    gain = s["accuracy_after_rl"] - s["accuracy_before_rl"]
    assert gain >= 0.15 and s["accuracy_after_rl"] >= 0.9, s
    warnings = run_dir / "warnings.txt"
    assert not warnings.exists(), warnings.read_text()
    assert abs(s["accuracy_shuffled_images"] - s["chance"]) <= 0.1, s
    assert "accuracy_before_rl" in done.stderr and "accuracy_after_rl" in done.stderr  # the table
