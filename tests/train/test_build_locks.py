"""A build lock that a killed DeepSpeed op build left behind: torch's JIT builder waits on it
forever, so a ZeRO run stops first and names the file (the hang that cut a CI run at 400 s)."""
from __future__ import annotations

import os
import time

import pytest
from torch.utils import cpp_extension
from torch.utils.file_baton import FileBaton

from mmrl import config
from mmrl.train import build_locks, parallel


def test_the_root_is_where_torch_builds(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(cpp_extension, "get_default_build_root", lambda: str(tmp_path))
    assert cpp_extension._get_build_directory("cpu_adam", False) == str(
        build_locks.extensions_root() / "cpu_adam")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "own"))
    assert cpp_extension._get_build_directory("cpu_adam", False) == str(
        build_locks.extensions_root() / "cpu_adam")


def _lock(root, op: str, age_s: float):
    (root / op).mkdir(parents=True)
    baton = FileBaton(str(root / op / "lock"))
    assert baton.try_acquire()  # what torch's builder takes, then "dies" without release()
    when = time.time() - age_s
    os.utime(root / op / "lock", (when, when))
    return baton


def test_a_killed_builds_lock_stops_a_zero_run_with_its_path(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build_locks.check()  # nothing there
    _lock(tmp_path, "deepspeed_shm_comm", age_s=60)  # a live build, a minute in: wait for it
    build_locks.check()
    assert not FileBaton(str(tmp_path / "deepspeed_shm_comm" / "lock")).try_acquire()
    _lock(tmp_path, "cpu_adam", age_s=40 * 60)
    assert build_locks.stale_locks() == [tmp_path / "cpu_adam" / "lock"]
    pytest.importorskip("deepspeed")
    cfg = config.load(None, ["data.train=x.jsonl", "train.parallel=deepspeed"])
    strategy = parallel.DeepSpeed(cfg, parallel.dist.DistInfo())
    with pytest.raises(RuntimeError, match=r"cpu_adam/lock \(40 min old\).*delete those lock"):
        strategy.before_model()  # before deepspeed.init_distributed, which would build
