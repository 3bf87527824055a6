"""Ulysses sequence parallelism on 2 gloo processes equals one process: per-token logprobs and
every parameter gradient to 1e-5 (float32), for Qwen2.5-VL (video + image), Qwen2-Audio and
Qwen2.5-Omni (audio + video / image) in both layouts, plus repeated key/value heads on the eager
kernel, the varlen kernel under gradient checkpointing, and FSDP2 and DeepSpeed ZeRO-3 over both
ranks (their reductions over every process add up the ranks' disjoint parts); and the frozen
encoder cache, filled once per step with each rank encoding its share of the media.

One torchrun launch runs every case (tests/integration/sp_worker.py); each test reads its row.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.test_launchers import _free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("sp_worker.py")
CASES = ["qwen2_5_vl-naive", "qwen2_5_vl-shared", "qwen2_audio-naive", "qwen2_audio-shared",
         "qwen2_5_omni-naive", "qwen2_5_omni-shared", "kv_repeat-eager-naive",
         "varlen-checkpointing-shared", "fsdp2-shared", "zero3-shared"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sp") / "results.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(WORKER),
           str(out)]
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_two_ranks_form_one_sequence_group(results):
    assert results["layout"] == {"data_world": 1, "data_rank": 0, "sp_rank": 0, "sp_size": 2}


@pytest.mark.parametrize("case", CASES)
def test_split_sequence_equals_one_process(results, case):
    row = results[case]
    if "skipped" in row:
        pytest.skip(row["skipped"])
    assert row["logp"] <= 1e-5, row
    assert row["same_names"] and row["grads"] >= 50, row
    assert row["grad"] <= 1e-5, row  # the worst tensor, relative to its norm
    assert row["encoder_grads"] >= 20, row  # every shard's encoder got its gradient


def test_cached_frozen_encoder_is_filled_in_shares_and_serves_the_split_forward(results):
    row = results["cache-sharded-fill"]
    assert row["encoded"] == 3 and row["served"] == 3, row  # 2 prompts: video, image + video
    # Each rank ran the tower on part of the patches; together exactly the whole, once.
    assert sum(row["encoder_rows"]) == row["whole_rows"], row
    assert 0 < min(row["encoder_rows"]) and max(row["encoder_rows"]) < row["whole_rows"], row
    assert row["logp"] <= 1e-5 and row["grad"] <= 1e-5, row
    assert row["same_names"] and row["grads"] >= 20, row
