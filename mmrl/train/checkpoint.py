"""Checkpoints: HF-format model + processor, plus everything needed to continue bit-for-bit.

Layout: RUN_DIR/checkpoints/step_000120/{config.json, model.safetensors, processor files,
trainer_state.pt}. A checkpoint is written into a hidden temp dir and renamed into place, so a
process killed mid-write (even by SIGKILL) leaves the previous checkpoint intact and loadable;
`latest()` never sees a partial one.
"""
from __future__ import annotations

import copy
import os
import pickle
import random
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mmrl.train import verify

if TYPE_CHECKING:
    from mmrl.train.parallel import Strategy

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
# Written beside the checkpoints once the first one is in place: this run folder has held one,
# so finding none that verifies later is a loss to report, never a reason to start over.
HELD = ".held"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or safely read; the message says what to do."""


def rng_state() -> dict[str, Any]:
    """Tensors and plain numbers only, so `torch.load(weights_only=True)` can read it back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])


def _safe_load(path: Path) -> Any:
    # weights_only: a checkpoint is data; a pickle that builds arbitrary objects (and could run
    # code) is refused instead of executed.
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refusing to load: it holds objects other than tensors and plain data "
            f"({str(e).splitlines()[0][:200]}). Only resume from checkpoints you wrote "
            f"yourself.") from None
    except (RuntimeError, EOFError, ValueError) as e:  # torch: "failed finding central directory"
        raise CheckpointError(f"{path}: cannot be read, it is damaged (truncated or overwritten: "
                              f"{str(e).splitlines()[0][:200]}); resume from an earlier "
                              f"checkpoint with train.resume=PATH") from None


def save(run_dir: Path, step: int, model, processor, trainer_state: dict[str, Any],
         keep: int = 2, strategy: Strategy | None = None, optimizer=None) -> Path:
    """Write checkpoint `step` atomically; prune to the newest `keep` (0 = keep all).

    Called on every rank. Rank 0 writes the HF-format model (or, when the weights are sharded,
    only its config), the processor and the trainer state; with ZeRO / FSDP2 every rank also
    writes its shard of the weights and optimizer state (`strategy.save_shards`)."""
    main = strategy is None or strategy.info.main
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a killed write
        tmp.mkdir()
    _barrier(strategy)
    try:
        _write(tmp, step, model, processor, trainer_state, strategy, optimizer, main)
        verify.fsync_files(tmp)  # every rank its own writes (and, cheaply, the clean rest)
        _barrier(strategy)
        if main:
            verify.write_manifest(tmp)  # last: sizes and CRC-32s of every file, for resume
    except WRITE_ERRORS as e:  # disk full: torch "basic_ios::clear", HF OSError, SafetensorError
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(write_failure(final, e)) from e
    if main:
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. after resume): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        (root / HELD).touch()
        _fsync_dir(root)
        if keep > 0:
            for old in all_checkpoints(run_dir)[:-keep]:
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
    _barrier(strategy)
    return final


def _write(tmp: Path, step: int, model, processor, trainer_state, strategy: Strategy | None,
           optimizer, main: bool) -> None:
    if strategy is not None and strategy.sharded_checkpoint:
        strategy.save_shards(tmp, model, optimizer)
    if strategy is not None and strategy.info.enabled:  # ranks draw different random streams
        torch.save(rng_state(), tmp / f"rng_rank{strategy.info.rank}.pt")
    if main:
        if strategy is not None and strategy.shards_params:
            hf_config(model).save_pretrained(tmp)  # weights: `mmrl checkpoint consolidate`
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
        _fault_injection_pause()


def _write_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return OSError, RuntimeError, SafetensorError


WRITE_ERRORS = _write_errors()


def write_failure(target: Path, error: BaseException) -> str:
    """One wording for every writer that fails (disk full, quota, a file size limit): what could
    not be written, the free space in the folder it was written to, and the checkpoint a resume
    starts from."""
    target = Path(target).absolute()
    folder = next((p for p in (target, *target.parents) if p.is_dir()), Path("/"))
    free = shutil.disk_usage(folder).free
    run_dir = next((p.parent if p.name == "checkpoints" else p for p in (target, *target.parents)
                    if p.name == "checkpoints" or (p / "checkpoints").is_dir()), None)
    prev = latest(run_dir) if run_dir is not None else None
    kept = (f"the previous checkpoint {prev} is intact: resume with train.resume=auto" if prev
            else "no checkpoint was written before it")
    first = (str(error.strerror if isinstance(error, OSError) and error.strerror else error)
             .splitlines() or [type(error).__name__])[0][:200]
    return (f"could not write {target} ({first}); {free / 2**30:.2f} GiB free in {folder}. Free "
            f"space (or set log.run_dir on a larger disk); {kept}")


def clean_stale(run_dir: Path) -> list[Path]:
    """Remove the `.tmp-*` leftovers of writes killed mid-way; -> the removed dirs."""
    root = Path(run_dir) / "checkpoints"
    stale = sorted(root.glob(".tmp-*")) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def hf_config(model):
    """The model's config naming its transformers class (not an FSDP2 wrapper class)."""
    config = copy.deepcopy(model.config)
    config.architectures = [next(c.__name__ for c in type(model).__mro__
                                 if c.__module__.startswith("transformers."))]
    return config


def has_weights(ckpt: Path | None) -> bool:
    """True for an HF-format (or LoRA adapter) checkpoint; False for sharded-only ones."""
    return ckpt is not None and any((Path(ckpt) / f).exists() for f in verify.WEIGHT_FILES)


def _barrier(strategy: Strategy | None) -> None:
    if strategy is not None and strategy.info.enabled:
        torch.distributed.barrier()


def all_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest(run_dir: Path) -> Path | None:
    ckpts = all_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_state(ckpt: Path, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """The trainer state, with this rank's own RNG state when saved by as many processes."""
    state = _safe_load(Path(ckpt) / STATE_FILE)
    own = Path(ckpt) / f"rng_rank{rank}.pt"
    if state.get("parallel", {}).get("world", 1) == world and own.is_file():
        state["rng"] = _safe_load(own)
    return state


def resolve_resume(resume: str, run_dir: Path, say=print, start_over: bool = False
                   ) -> Path | None:
    """`none` -> None; `auto` -> the newest checkpoint in run_dir that verifies (or None; each
    one skipped is named, with why, through `say`); else a path, which must verify.
    `start_over` (train.overwrite): `auto` may give None where checkpoints were and none verify."""
    if resume is None:
        return None
    if resume in RESUME_KEYWORDS:
        return RESUME_KEYWORDS[resume](run_dir, say, start_over)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"train.resume={resume}: no {STATE_FILE} there; point it at a "
                                f"checkpoints/step_NNNNNN dir or use resume=auto")
    found = verify.problem(path)
    if found:
        raise CheckpointError(f"train.resume={resume}: {found}; resume from another checkpoint, "
                              f"or train.resume=auto for the newest intact one")
    return path


def latest_intact(run_dir: Path, say=print, start_over: bool = False) -> Path | None:
    """The newest checkpoint that verifies (mmrl.train.verify); an older one when the newest is
    damaged (a node crash, a full disk, a copy cut short), each skipped one named. A run folder
    that has held checkpoints (HELD, or `*.damaged` ones set aside by an earlier try) and has
    none that verify is refused on every try, unless `start_over`: a requeue never silently
    restarts from step 0."""
    root = Path(run_dir) / "checkpoints"
    found = sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name)),
                   key=lambda p: int(_STEP_DIR.match(p.name).group(1))) if root.is_dir() else []
    skipped = []
    for ckpt in reversed(found):
        why = verify.problem(ckpt)
        if why is None:
            return ckpt
        skipped.append(f"{ckpt.name}: {why}")
        aside = ckpt.with_name(ckpt.name + ".damaged")  # kept to look at; the run redoes its step
        shutil.rmtree(aside, ignore_errors=True)
        ckpt.rename(aside)
        say(f"skipping checkpoint {ckpt}: {why} (moved to {aside.name})")
    aside = sorted(p.name for p in root.glob("step_*.damaged")) if root.is_dir() else []
    if (skipped or aside or (root / HELD).exists()) and not start_over:
        said = "; ".join(skipped) or f"set aside earlier: {', '.join(aside) or 'none left'}"
        raise CheckpointError(
            f"no checkpoint in {root} verifies ({said}); this run folder has held checkpoints, "
            f"so train.resume=auto will not start it over. Resume one of them explicitly with "
            f"train.resume=PATH only if you trust it, or start over with train.overwrite=true")
    return None


# train.resume's keywords -> the checkpoint they resume from (None: start fresh); else a path.
RESUME_KEYWORDS = {"none": lambda run_dir, say, start_over: None,
                   "": lambda run_dir, say, start_over: None, "auto": latest_intact}


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
