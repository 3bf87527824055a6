"""Errors that point at the right thing (issue #56, item 5): a full disk while logging names the
file written and the free space of its folder, without TensorBoard's thread traceback; a bad
value from an overlay YAML is blamed on the overlay; config.yaml shows the effective config
after a resume that changed values, the earlier ones in a comment; echoed values are clipped."""
from __future__ import annotations

import errno
import time

import pytest
import torch
import yaml
from safetensors.torch import save_file

from mmrl import config
from mmrl.cli import _one_line, config_summary
from mmrl.train import checkpoint, resume_config, rundir, verify
from mmrl.train.logging import RunLogger
from mmrl.validate import validate


class _FullDisk:
    def write(self, *args):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a full disk raises: no name

    flush = close = write


def test_disk_full_in_metrics_names_the_file_and_its_folder(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False, progress="silent")
    logger._metrics.close()
    logger._metrics = _FullDisk()
    with pytest.raises(OSError) as e:
        logger.log(1, {"loss": 0.5})
    msg = _one_line(e.value)
    assert msg.startswith(f"could not write {tmp_path / 'metrics.jsonl'} (No space left on "
                          f"device); ") and f"GiB free in {tmp_path}. Free space" in msg


def test_disk_full_in_tensorboard_names_its_folder_without_the_thread_traceback(
        tmp_path, monkeypatch, capfd):
    from tensorboard.summary.writer import record_writer

    logger = RunLogger(tmp_path, tensorboard=True, progress="silent")
    monkeypatch.setattr(record_writer.RecordWriter, "write", _FullDisk.write)  # disk now full
    with pytest.raises(OSError) as e:
        for step in range(1, 200):  # the writer thread dies on its first event; the next
            logger.log(step, {"loss": 0.5})  # add_scalar re-raises its error
            time.sleep(0.02)
    monkeypatch.undo()
    logger._tb = None  # its thread is gone: nothing to flush
    logger.close()
    msg = _one_line(e.value)
    assert msg.startswith(f"could not write {tmp_path / 'tensorboard'} (No space left on "
                          f"device); ") and f"GiB free in {tmp_path / 'tensorboard'}." in msg
    assert "Traceback" not in capfd.readouterr().err


def test_a_bad_overlay_value_is_blamed_on_the_overlay(tmp_path):
    base, overlay = tmp_path / "recipe.yaml", tmp_path / "tiny.yaml"
    base.write_text("data:\n  train: x.jsonl\ntrain:\n  lr: 1.0e-5\n")
    overlay.write_text("train:\n  lr: -1.0\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(base, [str(overlay)])
    assert str(e.value) == f"{overlay}: train.lr=-1.0: must be > 0"
    base.write_text("data:\n  train: x.jsonl\ntrain:\n  lr: -1.0\n")  # the base's own value
    overlay.write_text("train:\n  steps: 3\n")
    with pytest.raises(config.ConfigError, match=rf"^{base}: train.lr=-1.0: must be > 0$"):
        config.load(base, [str(overlay)])
    with pytest.raises(config.ConfigError, match=r"^override train.lr=-2: train.lr=-2.0"):
        config.load(base, [str(overlay), "train.lr=-2"])


def _checkpoint_with_config(run_dir, cfg, step: int):
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    torch.save({"step": step, "run_id": "r", "extra": {"config": resume_config.as_plain(cfg)}},
               ckpt / checkpoint.STATE_FILE)
    save_file({"w": torch.zeros(1)}, ckpt / "model.safetensors")
    verify.write_manifest(ckpt)


def test_config_yaml_shows_the_effective_values_after_a_resume(tmp_path):
    common = ["data.train=x.jsonl", f"log.run_dir={tmp_path}", "train.run_id=r"]
    first = config.load(None, [*common, "train.lr=1e-3", "train.steps=4"])
    config.save(first, tmp_path / "config.yaml")
    _checkpoint_with_config(tmp_path, first, 4)
    rundir.prepare(config.load(None, [*common, "train.resume=auto", "train.lr=5e-3",
                                      "train.steps=8"]))
    text = (tmp_path / "config.yaml").read_text()
    saved = config.load(tmp_path / "config.yaml")
    assert (saved.train.lr, saved.train.steps, saved.train.run_id) == (5e-3, 8, "r")
    assert "with these changes (before -> after; the config below holds the after values):\n" \
           "#   train.lr: 0.001 -> 0.005\n#   train.steps: 4 -> 8\n" in text
    # A second resume adds its block under the first; the file stays one loadable config.
    _checkpoint_with_config(tmp_path, saved, 8)
    rundir.prepare(config.load(None, [*common, "train.resume=auto", "train.lr=5e-3",
                                      "train.steps=12"]))
    text = (tmp_path / "config.yaml").read_text()
    assert text.count("# resumed from checkpoints/") == 2 and "#   train.steps: 8 -> 12" in text
    assert config.load(tmp_path / "config.yaml").train.steps == 12
    assert yaml.safe_load(text)["train"]["lr"] == 5e-3


def test_every_echoed_value_is_clipped():
    cfg = config.load(None, ["data.train=x.jsonl"])
    cfg.name = "N" * 10_000_000
    cfg.data.prompt_template = "T" * 10_000_000
    summary = config_summary(cfg)
    assert len(summary) < 2_000 and summary.count("characters)") == 3
    problems = validate(cfg)
    template = next(p for p in problems if p.startswith("data.prompt_template"))
    assert len(template) < 1_100 and "characters)" in template
    assert all(len(p) <= 1_100 for p in problems)
