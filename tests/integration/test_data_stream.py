"""A sharded Parquet dataset in EasyR1's layout (problem/answer/images with embedded PNG bytes)
trains the counting recipe's tiny config as it is: no conversion step, no data.format."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mmrl.data.inspect import LAZY_CHECK_ROWS

from mmrl.data.synthetic import GENERATORS
from mmrl.train import checkpoint

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def easyr1_shards(jsonl: Path, out: Path, shards: int) -> int:
    """mmrl's counting JSONL rewritten as EasyR1 ships data: `<image>` in the problem, the
    answer bare, image bytes embedded, split over `shards` files of 4-row row groups."""
    rows = []
    for line in jsonl.read_text().splitlines():
        r = json.loads(line)
        rows.append({"problem": "<image>" + r["prompt"], "answer": r["solution"],
                     "images": [{"bytes": (jsonl.parent / r["images"][0]).read_bytes(),
                                 "path": None}]})
    out.mkdir(parents=True)
    per = -(-len(rows) // shards)
    for k in range(shards):
        pq.write_table(pa.Table.from_pylist(rows[k * per:(k + 1) * per]),
                       out / f"train-{k:05d}-of-{shards:05d}.parquet", row_group_size=4)
    return len(rows)


def test_easyr1_parquet_shards_train_counting_without_conversion(tmp_path):
    GENERATORS.get("counting")(tmp_path / "gen", n_train=16, n_eval=4)
    assert easyr1_shards(tmp_path / "gen" / "train.jsonl", tmp_path / "train", 2) == 16
    easyr1_shards(tmp_path / "gen" / "eval.jsonl", tmp_path / "eval", 1)
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MMRL_EMBEDDED_DIR=str(tmp_path / "embedded"))
    proc = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "train", ROOT / "recipes/counting/config.yaml",
         ROOT / "recipes/counting/tiny.yaml", f"data.train={tmp_path / 'train'}",
         f"data.eval={tmp_path / 'eval'}", "data.format=null", "data.generate=null",
         "sft.steps=0", "rollout.max_new_tokens=4", "rollout.num_generations=2",
         "rollout.prompts_per_step=2", "train.micro_batch_size=4", f"log.run_dir={run}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert checkpoint.latest(run).name == "step_000002"
    assert torch.load(checkpoint.latest(run) / checkpoint.STATE_FILE, weights_only=False)["step"] == 2
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/count_mean" in m] == [1, 2]
    # Only drawn samples had their images decoded: 2 steps x 2 prompts + the 4 eval samples + the
    # first rows the reward scorability check adapts (mmrl/data/inspect.py LAZY_CHECK_ROWS).
    assert 1 <= len(list((tmp_path / "embedded").iterdir())) <= 2 * 2 + 4 + LAZY_CHECK_ROWS
