"""Checkpoints verify before a run resumes from them: every file is fsynced before the rename and
listed with its size and CRC-32, `resume=auto` skips a damaged newest checkpoint (truncated,
emptied, missing or bit-flipped files), naming it and why, and falls back to the newest intact
one; a checkpoint without weights is refused, never resumed as the base model; a write that
fails in the safetensors writer gets the same wording as every other writer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.models import get_adapter
from mmrl.train import checkpoint, verify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return get_adapter("qwen2_5_vl").tiny(min_pixels=3136, max_pixels=3136)


def _two_checkpoints(run_dir: Path, tiny) -> tuple[Path, Path]:
    model, processor = tiny
    first = checkpoint.save(run_dir, 1, model, processor, {"run_id": "r"}, keep=0)
    second = checkpoint.save(run_dir, 2, model, processor, {"run_id": "r"}, keep=0)
    return first, second


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # inside the last tensor's bytes: safetensors itself loads it
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated weights": (lambda c: _truncate(c / "model.safetensors"),
                          "model.safetensors is {size} bytes, {full} were written"),
    "empty trainer state": (lambda c: (c / "trainer_state.pt").write_bytes(b""),
                            "trainer_state.pt is 0 bytes"),
    "missing weights": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
    "flipped byte": (lambda c: _flip(c / "model.safetensors"),
                     "model.safetensors does not hold the bytes that were written"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_auto_skips_a_damaged_newest_checkpoint(tmp_path, tiny, damage):
    first, second = _two_checkpoints(tmp_path, tiny)
    full = (second / "model.safetensors").stat().st_size
    hurt, says = DAMAGE[damage]
    hurt(second)
    size = (second / "model.safetensors").stat().st_size if (second / "model.safetensors").exists() \
        else 0
    lines = []
    assert checkpoint.resolve_resume("auto", tmp_path, say=lines.append) == first
    assert len(lines) == 1 and lines[0].startswith(f"skipping checkpoint {second}: ")
    assert says.format(size=size, full=full) in lines[0]
    assert "(moved to step_000002.damaged)" in lines[0] and not second.exists()
    assert checkpoint.load_state(first)["step"] == 1


def test_an_explicit_damaged_checkpoint_or_all_damaged_is_an_error(tmp_path, tiny):
    first, second = _two_checkpoints(tmp_path, tiny)
    _truncate(second / "trainer_state.pt")
    with pytest.raises(checkpoint.CheckpointError, match=r"train.resume=.*step_000002: "
                                                         r"trainer_state.pt is \d+ bytes"):
        checkpoint.resolve_resume(str(second), tmp_path)
    _flip(first / "model.safetensors")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.resolve_resume("auto", tmp_path, say=lambda line: None)
    assert "no checkpoint in" in str(e.value) and "step_000002: trainer_state.pt" in str(e.value) \
        and "step_000001: model.safetensors does not hold" in str(e.value)


def test_a_checkpoint_without_a_manifest_still_needs_its_weights(tmp_path, tiny):
    """Written before manifests: a missing model.safetensors resumed the base model with step
    N's optimizer state; a truncated one gave a foreign one-liner naming no file."""
    first, second = _two_checkpoints(tmp_path, tiny)
    for ckpt in (first, second):
        (ckpt / verify.MANIFEST).unlink()
    (second / "model.safetensors").unlink()
    assert verify.problem(second) == ("it holds no weights (none of model.safetensors, "
                                      "model.safetensors.index.json, adapter_model.safetensors, "
                                      "no shards)")
    _truncate(first / "model.safetensors")
    assert "model.safetensors is" in verify.problem(first) and "(truncated)" in verify.problem(first)
    (first / "trainer_state.pt").write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(checkpoint.CheckpointError, match=r"trainer_state.pt: cannot be read, it "
                                                         r"is damaged"):
        checkpoint.load_state(first)


def test_every_file_is_fsynced_before_the_rename(tmp_path, tiny, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(verify.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    final = checkpoint.save(tmp_path, 3, *tiny, {"run_id": "r"})
    rename = events.index(("replace", str(tmp_path / "checkpoints" / ".tmp-step_000003")))
    synced = {Path(p).name for kind, p in events[:rename] if kind == "fsync"}
    written = {p.name for p in final.rglob("*") if p.is_file()}
    assert written <= synced and verify.MANIFEST in written
    listed = json.loads((final / verify.MANIFEST).read_text())["files"]
    assert set(listed) == written - {verify.MANIFEST}
    assert listed["model.safetensors"]["size"] == (final / "model.safetensors").stat().st_size


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from mmrl.models import get_adapter
from mmrl.train import checkpoint
run = Path(sys.argv[1])
model, processor = get_adapter("qwen2_5_vl").tiny(min_pixels=3136, max_pixels=3136)
checkpoint.save(run, 1, model, processor, {})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))  # the weights are larger
try:
    checkpoint.save(run, 2, model, processor, {})
except checkpoint.CheckpointError as e:
    print(e)
"""


def test_a_failed_safetensors_write_is_worded_like_every_writer(tmp_path):
    """The kernel refuses the write inside safetensors' own (Rust) writer, as on a full disk:
    it raised an unwrapped SafetensorError with no advice."""
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    msg = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0 and msg, out.stderr[-2000:]
    ckpts = tmp_path / "checkpoints"
    assert msg.startswith(f"could not write {ckpts / 'step_000002'} (")
    assert "File too large" in msg and f"GiB free in {ckpts}. Free space (or set log.run_dir on " \
        f"a larger disk); the previous checkpoint {ckpts / 'step_000001'} is intact: resume with " \
        f"train.resume=auto" in msg
    assert sorted(p.name for p in ckpts.iterdir()) == [checkpoint.HELD, "step_000001"]
