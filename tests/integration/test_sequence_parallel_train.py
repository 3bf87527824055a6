"""`mmrl train` with train.sequence_parallel=2 on 2 gloo processes (one sequence group, the
torchrun line of scripts/train.sh) trains exactly as the same 2 processes without it (2
data-parallel ranks): the same rollouts (each rank of the group samples its half of the prompts,
as each data-parallel rank does; train/sp.py), rewards, losses and gradient norms each step,
and the same weights after two steps; under FSDP2 too (accelerate launch). So the group counts its rows once (normaliser, advantages,
metric means) and adds up its ranks' gradient parts exactly once: the update equals the one
over the whole batch, which the data-parallel run computes (tests/integration/test_distributed.py
holds that equal to one process). Tiny Qwen2.5-VL in float32 on 8-frame videos (both ranks
encode part of each video), GRPO with a KL reference and two iterations per rollout, so the
old-policy, reference and update forwards all run split; and with the vision tower frozen, its
output cached once per step (each rank of the group encoding its share). One step each of
tiny Qwen2-Audio (audio QA) and Qwen2.5-Omni (audio + video) as well.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from mmrl.data import synthetic
from tests.integration.test_launchers import _free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    # The workers' own lines, not torchrun's report of their exit.
    said = [line for line in out.stderr.splitlines() if "torch/distributed" not in line]
    assert out.returncode == 0, "\n".join(said)[-6000:]
    return out


@pytest.fixture(scope="module")
def runs(tiny_config, user_rewards, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sp_train")
    synthetic.GENERATORS.get("video_qa")(root / "data", n_train=4, n_eval=2)
    cfg = tiny_config(root / "cfg.yaml", root / "data", name="sp_train",
                      data={"generate": None, "video_nframes": 8, "video_fps": None},
                      rollout={"prompts_per_step": 2, "num_generations": 2},
                      algo={"advantage": "grpo", "beta": 0.04, "num_iterations": 2},
                      train={"steps": 2, "max_grad_norm": 0.0, "micro_batch_size": 2})
    env = dict(os.environ, PYTHONPATH=f"{user_rewards}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    train = ["-m", "mmrl.cli", "train", str(cfg), "data.shuffle=false"]
    # scripts/train.sh's line: --standalone picks a free port (a fixed one may be taken).
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2"]
    _run([*torchrun, *train, f"log.run_dir={root / 'dp'}"], env, root)
    split = _run([*torchrun, *train, f"log.run_dir={root / 'sp'}", "train.sequence_parallel=2"],
                 env, root)
    # FSDP2 through accelerate launch: its reduce-scatter over both processes adds the parts.
    _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
          str(ROOT / "scripts" / "accelerate" / "fsdp2.yaml"), "--num_processes", "2",
          "--main_process_port", str(_free_port()), *train,
          f"log.run_dir={root / 'fsdp2'}", "train.sequence_parallel=2", "train.steps=1"], env, root)
    # The vision tower frozen: its output cached once per step (Policy.begin_step), the split
    # run filling the cache with each rank encoding its share.
    frozen = ["model.freeze=[vision]", "train.steps=1"]
    _run([*torchrun, *train, f"log.run_dir={root / 'dp_frozen'}", *frozen], env, root)
    cached = _run([*torchrun, *train, f"log.run_dir={root / 'sp_frozen'}", *frozen,
                   "train.sequence_parallel=2"], env, root)
    return {"root": root, "log": split.stdout + split.stderr,
            "cached_log": cached.stdout + cached.stderr}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_split_each_sequence(runs):
    assert "sequence parallelism: 2 ranks per sequence" in runs["log"]


def test_split_run_trains_as_the_data_parallel_run(runs):
    one, two = (_metrics(runs["root"] / name) for name in ("dp", "sp"))
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        # Same completions (decoded lengths) and rewards: the group's rollout is the one the
        # data-parallel ranks sample;
        # same loss and gradient norm: the loss normaliser and metric means count the group's
        # rows once, the gradients add up its ranks' disjoint parts exactly once.
        for key in ("completion/length_mean", "reward/total_mean", "loss/loss", "loss/kl", "grad_norm"):
            assert key in a and b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert one[0]["grad_norm"] > 0
    # Weights after two AdamW steps (lr 1e-3: an update is ~ lr * g / |g|, so float noise in a
    # near-zero gradient entry moves that weight by up to a few % of lr): 5e-5 absolute.
    a, b = (load_file(runs["root"] / name / "checkpoints" / "step_000002" / "model.safetensors")
            for name in ("dp", "sp"))
    assert a.keys() == b.keys() and any(k.startswith("visual") or ".visual" in k for k in a)
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst < 5e-5, worst
    start = load_file(runs["root"] / "dp" / "reference" / "model.safetensors")
    moved = max(float((a[k].float() - start[k].float()).abs().max()) for k in a if k in start)
    assert moved > 1e-3  # it trained: the agreement is not two runs that changed nothing


def test_split_run_under_fsdp2_takes_the_same_steps(runs):
    one, two = (_metrics(runs["root"] / name) for name in ("dp", "fsdp2"))
    assert len(two) == 1  # one step: enough for the reductions, and 10 s less in CI
    for a, b in zip(one, two):
        for key in ("reward/total_mean", "loss/loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=2e-5), key


def test_split_run_with_a_frozen_tower_serves_its_cache_as_the_data_parallel_run(runs):
    assert "encoders: cached once per step (frozen)" in runs["cached_log"]
    one, two = (_metrics(runs["root"] / name) for name in ("dp_frozen", "sp_frozen"))
    assert len(one) == len(two) == 1
    for key in ("reward/total_mean", "loss/loss", "loss/kl", "grad_norm"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("family,task", [("qwen2_audio", "audio_qa"),
                                         ("qwen2_5_omni", "audio_visual")])
def test_audio_and_omni_split_runs_take_the_data_parallel_step(family, task, tiny_config,
                                                               user_rewards, tmp_path):
    """Qwen2-Audio (whole audios are the units a rank encodes) and Qwen2.5-Omni (audio and
    video in one prompt): one step with the sequence split equals the data-parallel step."""
    synthetic.GENERATORS.get(task)(tmp_path / "data", n_train=4, n_eval=2)
    cfg = tiny_config(tmp_path / "cfg.yaml", tmp_path / "data", name=f"sp_{family}",
                      data={"generate": None, "video_nframes": 4, "video_fps": None},
                      model={"family": family},
                      rollout={"prompts_per_step": 2, "num_generations": 2},
                      algo={"advantage": "grpo", "beta": 0.04, "num_iterations": 2},
                      train={"steps": 1, "max_grad_norm": 0.0, "micro_batch_size": 2})
    text = yaml.safe_load(cfg.read_text())
    text["model"]["tiny"] = {}  # the image-size keys are Qwen2.5-VL's
    cfg.write_text(yaml.safe_dump(text, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=f"{user_rewards}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "-m", "mmrl.cli", "train", str(cfg), "data.shuffle=false"]
    _run([*torchrun, f"log.run_dir={tmp_path / 'dp'}"], env, tmp_path)
    split = _run([*torchrun, f"log.run_dir={tmp_path / 'sp'}", "train.sequence_parallel=2"],
                 env, tmp_path)
    assert "sequence parallelism: 2 ranks per sequence" in split.stdout + split.stderr
    one, two = (_metrics(tmp_path / name) for name in ("dp", "sp"))
    assert one[0]["grad_norm"] > 0
    for key in ("completion/length_mean", "reward/total_mean", "loss/loss", "loss/kl", "grad_norm"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-7), key
