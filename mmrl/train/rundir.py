"""One run per run directory: a fresh run never writes into another run's files, a resumed run
continues only its own checkpoints, and its logs are cut back to the checkpoint it resumes from.

Called by rank 0 before the trainer opens any file in the run dir.
"""
from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import yaml

from mmrl.config import RunConfig
from mmrl.train import checkpoint

LOGS = ("metrics.jsonl", "rollouts.jsonl")
# What a run writes; `train.overwrite=true` removes exactly these, nothing the user put there.
RUN_FILES = (*LOGS, "config.yaml", "summary.json", "checkpoints", "tensorboard", "eval",
             "reference", "merged", "wandb")


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
    resume = checkpoint.resolve_resume(tc.resume, run_dir, say=_say)
    owner = _stored_run_id(run_dir)
    if tc.starts_fresh and _used(run_dir):
        if not tc.overwrite:
            raise RunDirError(
                f"{run_dir} already holds a run; continue it with train.resume=auto, start a new "
                f"one with log.run_dir=OTHER_DIR, or replace it with train.overwrite=true")
        for name in RUN_FILES:
            path = run_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
        owner = None
    if resume is not None:
        theirs = checkpoint.load_state(resume).get("run_id")
        mine = tc.run_id or owner
        if theirs and mine and theirs != mine:
            raise RunDirError(
                f"{resume} belongs to run {theirs}, not to this run ({mine}); resume it with "
                f"train.resume={resume} explicitly, or start fresh with train.overwrite=true")
        tc.run_id = theirs or mine
    elif tc.resumes_latest:
        tc.run_id = tc.run_id or owner  # nothing saved yet: start over in the same run
    tc.run_id = tc.run_id or uuid.uuid4().hex[:12]
    step = checkpoint.load_state(resume)["step"] if resume is not None else 0
    for name in LOGS:
        truncate_jsonl(run_dir / name, step)
    return resume


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _used(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


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
