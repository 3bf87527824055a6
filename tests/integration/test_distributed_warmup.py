"""The SFT warm-up and the held-out evaluation split their work over data-parallel processes
(torchrun, gloo on CPU): each rank trains on its share of a warm-up batch and draws its share of
the evaluation records, and two processes end where one does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_launchers import _free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("sft_worker.py")
# The visual_search recipe's tiny layer with a demonstration warm-up (a crop of the patch, the
# real tool's crop, then the answer): trajectories in the warm-up and in the evaluation.
CONFIG = ["recipes/visual_search/config.yaml", "recipes/visual_search/tiny.yaml",
          "tools.call_format=json_box", "sft.steps=4", "sft.eval_every=2", "sft.batch_size=8",
          "sft.val_samples=6", "sft.turn_targets=['{{\"bbox_2d\": {patch_box_resized}}}', "
          "'<answer>{solution}</answer>']", "rollout.max_new_tokens=32", "eval.max_new_tokens=16"]


def _run(nproc: int, out: Path, cwd: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    launch = ([sys.executable] if nproc == 1 else
              [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}"])
    done = subprocess.run([*launch, str(WORKER), str(out), *CONFIG], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out, weights_only=False)


def test_two_processes_warm_up_and_evaluate_as_one(tmp_path):
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # the config's relative paths
    one = _run(1, tmp_path / "one" / "out.pt", tmp_path)
    two = _run(2, tmp_path / "two" / "out.pt", tmp_path)
    # Each rank loaded half of every warm-up batch (8 records: 4 + 4) ...
    assert one["counts"][0]["loaded"] == [8] * 4
    assert [c["loaded"] for c in two["counts"]] == [[4] * 4, [4] * 4]
    # ... and drew half of each evaluation: two val checks of 6 records, then the 4 held-out.
    assert one["counts"][0]["drawn"] == [6, 6, 4]
    assert [c["drawn"] for c in two["counts"]] == [[3, 3, 2], [3, 3, 2]]
    # The same update: float32 sums in another order, through four Adam steps.
    worst = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
    assert worst < 1e-4, worst
    assert two["sft"]["steps"] == 4 and [h["step"] for h in two["sft"]["history"]] == [2, 4]
    # Every rank's evaluation rows, in the order one process writes them, with their trajectories.
    rows = {n: [json.loads(x) for x in (tmp_path / n / "out.jsonl").read_text().splitlines()]
            for n in ("one", "two")}
    assert [r["id"] for r in rows["two"]] == [r["id"] for r in rows["one"]]
    assert all(r["turns"] for r in rows["two"])
    assert two["result"]["n"] == one["result"]["n"] == 4
    assert two["result"]["turns/mean"] == one["result"]["turns/mean"]
    assert two["result"]["accuracy"] == one["result"]["accuracy"]
