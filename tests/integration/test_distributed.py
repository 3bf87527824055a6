"""Data-parallel training through the real launcher (torchrun, gloo on CPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.train import checkpoint
from tests.integration.test_launchers import _free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dist_worker.py")

@pytest.fixture(scope="module")
def env(user_rewards) -> dict:
    return dict(os.environ, PYTHONPATH=f"{user_rewards}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")


@pytest.fixture
def write_config(tiny_config, tmp_path):
    """4 prompts a step, so that 2 ranks hold 2 each; no gradient clipping."""
    def write(adv: str = "reinforce_pp") -> Path:
        return tiny_config(tmp_path / "dist.yaml", tmp_path / "data", name="dist",
                           rollout={"prompts_per_step": 4},
                           algo={"advantage": adv, "agg": "token_mean"},
                           train={"micro_batch_size": 4, "max_grad_norm": 0.0})
    return write


def _torchrun(nproc: int, args: list[str], env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_two_processes_match_one_on_the_same_global_batch(tmp_path, env, write_config):
    """reinforce_pp whitens by the *batch* std, so this also proves advantages use every rank's
    rewards; max_grad_norm=0 disables clipping so the comparison is of the raw update."""
    cfg = write_config()
    single = subprocess.run([sys.executable, str(WORKER), str(cfg), str(tmp_path / "one.pt")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    double = _torchrun(2, [str(WORKER), str(cfg), str(tmp_path / "two.pt")], env, tmp_path)
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["grads"].keys() == two["grads"].keys()
    assert any(k.startswith("model.visual") for k in one["grads"])
    # Gradients: 1e-5 relative to each tensor's largest entry (float32 sums in another order).
    for k, g in one["grads"].items():
        scale = float(g.abs().max()) + 1e-12
        assert float((g - two["grads"][k]).abs().max()) / scale < 1e-5, k
    # Parameters after the Adam step: Adam divides by sqrt(v) ~ |g|, so float noise in tiny
    # gradients becomes ~1e-6 of lr; 1e-5 absolute at lr 1e-3.
    worst = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
    assert worst < 1e-5, worst
    assert two["metrics"]["loss/loss"] == pytest.approx(one["metrics"]["loss/loss"], rel=1e-4, abs=1e-6)


def test_two_process_cli_run_resumes_in_one(tmp_path, env, write_config):
    cfg = write_config(adv="grpo")
    run_dir = tmp_path / "run"
    two = _torchrun(2, ["-m", "mmrl.cli", "train", str(cfg), f"log.run_dir={run_dir}"], env,
                    tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert checkpoint.latest(run_dir).name == "step_000002"
    assert (run_dir / "rank1" / "metrics.jsonl").exists()  # rank 1 logs apart, rank 0 owns RUN_DIR
    one = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", str(cfg),
                          f"log.run_dir={run_dir}", "train.steps=3", "train.resume=auto"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "resumed from" in one.stderr and checkpoint.latest(run_dir).name == "step_000003"
