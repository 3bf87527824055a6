"""One run per run directory: a fresh run never writes into another run's files, a resumed run
continues only its own checkpoints, and its logs are cut back to the checkpoint it resumes from.

Called by rank 0 before the trainer opens any file in the run dir.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import yaml

from mmrl.config import RunConfig
from mmrl.train import checkpoint, resume_config

LOGS = ("metrics.jsonl", "rollouts.jsonl")
# What a run writes; `train.overwrite=true` removes exactly these, nothing the user put there.
RUN_FILES = (*LOGS, "config.yaml", "summary.json", "checkpoints", "tensorboard", "eval",
             "reference", "merged", "wandb", "rollout_media")


class RunDirError(RuntimeError):
    pass


def prepare(cfg: RunConfig) -> Path | None:
    """Check the run dir against train.resume / train.overwrite, set `cfg.train.run_id`, clean
    stale checkpoint temp dirs and cut logs back; -> the checkpoint to resume from (or None)."""
    tc, run_dir = cfg.train, cfg.run_dir
    removed = checkpoint.clean_stale(run_dir)
    if removed:
        print(f"removed {len(removed)} unfinished checkpoint write(s): "
              f"{', '.join(p.name for p in removed)}")
    resume = checkpoint.resolve_resume(tc.resume, run_dir, say=_say, start_over=tc.overwrite)
    owner = _stored_run_id(run_dir)
    # resume=auto with overwrite=true and nothing to resume: the user chose to start over
    if (tc.starts_fresh or (resume is None and tc.overwrite)) and _used(run_dir):
        if not tc.overwrite:
            raise RunDirError(
                f"{run_dir} already holds a run; continue it with train.resume=auto, start a new "
                f"one with log.run_dir=OTHER_DIR, or replace it with train.overwrite=true")
        for name in RUN_FILES:
            path = run_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
        owner = None
    state = checkpoint.load_state(resume) if resume is not None else {"step": 0}
    if resume is not None:
        theirs = state.get("run_id")
        mine = tc.run_id or owner
        if theirs and mine and theirs != mine:
            raise RunDirError(
                f"{resume} belongs to run {theirs}, not to this run ({mine}); resume it with "
                f"train.resume={resume} explicitly, or start fresh with train.overwrite=true")
        tc.run_id = theirs or mine
        changes = resume_config.check(state.get("extra", {}).get("config"), cfg, resume, _say)
        resume_config.record(run_dir / "config.yaml", resume, changes, cfg)
    elif tc.resumes_latest:
        tc.run_id = tc.run_id or owner  # nothing saved yet: start over in the same run
        (run_dir / "config.yaml").unlink(missing_ok=True)  # the Trainer writes this start's
    tc.run_id = tc.run_id or uuid.uuid4().hex[:12]
    for name in LOGS:
        truncate_jsonl(run_dir / name, state["step"])
    return resume


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _used(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(p.name != LOCK for p in run_dir.iterdir())


LOCK = ".mmrl.lock"


@contextmanager
def locked(run_dir: Path):
    """Inside: this process holds the run dir (an OS file lock, which the kernel releases on any
    exit, a crash or SIGKILL included, so it never goes stale); a second `mmrl train` on the
    same dir, e.g. a requeued job beside the old one, stops with one line naming the holder.
    On NFS, flock is a POSIX lock held by the server (Linux clients since 2.6.12)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunDirError(f"{run_dir} is in use by {holder}; wait for it to finish or stop it "
                          f"(kill -TERM saves a checkpoint), or use another log.run_dir") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()} (since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        yield
    finally:
        f.close()  # releases the lock


def _stored_run_id(run_dir: Path) -> str | None:
    path = run_dir / "config.yaml"
    try:
        return ((yaml.safe_load(path.read_text()) or {}).get("train") or {}).get("run_id")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def truncate_jsonl(path: Path, step: int) -> int:
    """Keep the rows with "step" <= step (a resumed run writes the later ones again) and drop a
    broken line (a write cut short by a kill); -> rows dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line)
            ok = isinstance(row, dict) and int(row.get("step", 0)) <= step
        except (ValueError, TypeError):
            ok = False
        if ok:
            kept.append(line + b"\n")
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)
    return dropped
