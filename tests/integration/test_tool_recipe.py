"""The visual_search recipe's tiny layer launched the way users launch it, through
scripts/train.sh (torchrun, one process): trajectories in the step metrics and in the
evaluation's records. (~60 s: one launch, one RL step, a 4-record evaluation.)"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_visual_search_tiny_through_train_sh(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ["bash", str(ROOT / "scripts" / "train.sh"), "1", "recipes/visual_search/config.yaml",
           "recipes/visual_search/tiny.yaml", f"log.run_dir={run_dir}", "log.tensorboard=false",
           "sft.steps=0", "train.steps=1", "eval.max_new_tokens=8"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # the launch line's relative paths
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "tools: crop (qwen calls, up to 2 turns" in done.stderr
    (row,) = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["turns/mean"] >= 1 and 0 <= row["tools/called_frac"] <= 1
    assert {f"tools/errors/{k}" for k in ("malformed", "bad_box", "timeout")} <= set(row)
    assert "reward/tool_use_mean" in row
    records = [json.loads(ln) for ln in
               (run_dir / "eval" / "after_rl.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["turns"] and isinstance(r["calls"], list) for r in records)
    assert all(r["completion"] == r["turns"][-1] for r in records)  # rewards score the last turn
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after_rl"]["turns/mean"] >= 1
