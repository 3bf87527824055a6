"""The quickstart's promise, as a user runs it: RL improves held-out accuracy by >= 0.15 over
the warmed-up model, and with images shuffled across samples accuracy falls to chance (the
model reads pixels). Several minutes on 2 cores: the slowest test, and the one that matters."""
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
    assert gain >= 0.15, s
    assert abs(s["accuracy_shuffled_images"] - s["chance"]) <= 0.1, s
    assert "accuracy_before_rl" in done.stderr and "accuracy_after_rl" in done.stderr  # the table
