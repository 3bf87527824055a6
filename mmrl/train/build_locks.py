"""Stale build locks: DeepSpeed compiles its CPU ops (cpu_adam for ZeRO-Offload, shm_comm for
its CPU collectives) with torch's JIT extension builder, the first time a run needs them. That
builder takes a `lock` file in the op's build folder and releases it when done; a process killed
mid-build (Ctrl-C twice, SIGKILL, a job scheduler's time limit) leaves the file behind, and every
later run then waits on it forever, printing nothing. A build takes one to three minutes, so a
lock far older than that is stale: the run stops at once and names it instead of hanging."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

STALE_AFTER_S = 15 * 60


def extensions_root() -> Path:
    """Where torch builds JIT extensions: $TORCH_EXTENSIONS_DIR, else the user's cache folder
    with a python/accelerator subfolder (torch.utils.cpp_extension's rule)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root
    accel = (f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip else
             f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{py}_{accel}"


def stale_locks(root: Path | None = None, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    root = extensions_root() if root is None else root
    now = time.time()
    return sorted(p for p in root.glob("*/lock")
                  if p.is_file() and now - p.stat().st_mtime > older_than_s)


def check() -> None:
    """Raise, naming every stale lock and what to do, before DeepSpeed would wait on one."""
    locks = stale_locks()
    if locks:
        ages = ", ".join(f"{p} ({(time.time() - p.stat().st_mtime) / 60:.0f} min old)"
                         for p in locks)
        raise RuntimeError(
            f"DeepSpeed would wait forever on a torch extension build lock that a killed build "
            f"left behind: {ages}. If no other run is building these ops right now, delete "
            f"those lock files and start again (the built ops next to them are reused).")
