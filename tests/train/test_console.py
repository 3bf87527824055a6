"""What a run prints: the warm-up's progress between its checks, and no other library's lines
through the live display (transformers' "Writing model shards" bar at each checkpoint,
DeepSpeed's "Setting accelerator to CPU" when accelerate first imports it at a save)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from mmrl import cli
from mmrl.train.logging import RunLogger


@pytest.fixture(scope="module")
def small_model():
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1))


def test_no_shard_bar_while_a_run_logs_and_the_setting_comes_back(small_model, tmp_path, capfd):
    hf_logging.enable_progress_bar()  # as a fresh process has it (a test before may have run a
    assert hf_logging.is_progress_bar_enabled()  # trainer in this worker that raised mid-run)
    small_model.save_pretrained(tmp_path / "before")
    assert "Writing model shards" in capfd.readouterr().err  # what tore the bar
    log = RunLogger(tmp_path / "run", tensorboard=False, progress="lines")
    small_model.save_pretrained(tmp_path / "during")  # a checkpoint save mid-run
    assert capfd.readouterr().err == ""
    log.close()
    assert hf_logging.is_progress_bar_enabled()


def _printed(capfd, run_dir, progress: str, steps: int, checks: set[int],
             log_every: int) -> list[str]:
    log = RunLogger(run_dir / progress, tensorboard=False, progress=progress, log_every=log_every)
    log.start(total=steps, description="SFT warm-up")
    for step in range(1, steps + 1):
        log.advance(step, steps, f"loss {1 / step:.3f}", label="sft step", keep=step in checks)
    log.stop()
    log.close()
    return [ln.strip() for ln in capfd.readouterr().err.splitlines() if "sft step" in ln]


def test_lines_mode_prints_progress_between_checks_and_every_check(capfd, tmp_path):
    lines = _printed(capfd, tmp_path, "lines", steps=12, checks={7}, log_every=5)
    assert lines == ["sft step 1/12  loss 1.000", "sft step 5/12  loss 0.200",
                     "sft step 7/12  loss 0.143", "sft step 10/12  loss 0.100",
                     "sft step 12/12  loss 0.083"]


def test_bar_mode_keeps_each_check_above_the_bar_and_off_mode_only_checks(capfd, tmp_path):
    check = "sft step 7/12  loss 0.143"
    assert check in _printed(capfd, tmp_path, "bar", steps=12, checks={7}, log_every=5)
    assert _printed(capfd, tmp_path, "off", steps=12, checks={7}, log_every=5) == [check]


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed warns only where it finds no GPU")
def test_train_names_deepspeeds_cpu_accelerator_so_its_import_is_silent(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    cli._quiet_cpu_deepspeed()
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    code = "import deepspeed.accelerator as a; print(a.get_accelerator()._name)"
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ))
    assert quiet.stdout.strip() == "cpu" and "Setting accelerator" not in quiet.stderr, quiet.stderr
