"""Checkpoints: HF-format model + processor, plus everything needed to continue bit-for-bit.

Layout: RUN_DIR/checkpoints/step_000120/{config.json, model.safetensors, processor files,
trainer_state.pt}. A checkpoint is written into a hidden temp dir and renamed into place, so a
process killed mid-write (even by SIGKILL) leaves the previous checkpoint intact and loadable;
`latest()` never sees a partial one.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(run_dir: Path, step: int, model, processor, trainer_state: dict[str, Any],
         keep: int = 2) -> Path:
    """Write checkpoint `step` atomically; prune to the newest `keep` (0 = keep all)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    _fault_injection_pause()
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. after resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep > 0:
        for old in all_checkpoints(run_dir)[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


def all_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest(run_dir: Path) -> Path | None:
    ckpts = all_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_state(ckpt: Path) -> dict[str, Any]:
    # weights_only=False: the state holds numpy RNG tuples and python lists; it is our own file.
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


def resolve_resume(resume: str, run_dir: Path) -> Path | None:
    """`none` -> None; `auto` -> newest complete checkpoint in run_dir (or None); else a path."""
    if resume in ("none", "", None):
        return None
    if resume == "auto":
        return latest(run_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"train.resume={resume}: no {STATE_FILE} there; point it at a "
                                f"checkpoints/step_NNNNNN dir or use resume=auto")
    return path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # not all filesystems allow fsync on directories
        pass


def _fault_injection_pause() -> None:
    # For the crash-safety test only: widens the window in which a checkpoint is half-written so
    # the test can SIGKILL the process inside it deterministically.
    delay = float(os.environ.get("MMRL_TEST_CHECKPOINT_DELAY") or 0)
    if delay > 0:
        flag = os.environ.get("MMRL_TEST_CHECKPOINT_FLAG")
        if flag:  # tells the test "now inside the write"
            Path(flag).touch()
        time.sleep(delay)
