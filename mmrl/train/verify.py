"""What a checkpoint must pass before a run resumes from it or a tool reads it.

- Every file as it was written: `manifest.json` lists each file's size and CRC-32, written last
  into the checkpoint's temp dir (after every file was fsynced), so a truncated, emptied, missing
  or bit-flipped file is found before anything loads it. CRC-32 finds damage, not forgery: what
  a crafted file may do is bounded by the next point.
- Nothing but tensors and plain data in its pickles. `trainer_state.pt` loads with
  `torch.load(weights_only=True)` (checkpoint.py). Sharded weights are read by their libraries
  with full pickle: torch DCP's `FileSystemReader` unpickles `dcp/.metadata` and its planner
  `torch.load(weights_only=False)`s the non-tensor items, DeepSpeed's engine and `zero_to_fp32`
  `torch.load(weights_only=False)` every shard. So they are first read here the safe way: the
  metadata through an unpickler that builds only DCP's metadata records, torch.Size, dtypes and
  paths; every other pickle with `weights_only=True` (plus DeepSpeed's four plain record
  classes). A file that needs anything else is refused, naming it.
- Weights present: a checkpoint without `model.safetensors` (or a LoRA adapter, or shards) would
  resume the base model under step N's optimizer state.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

MANIFEST = "manifest.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin")
SHARD_DIRS = ("deepspeed", "dcp")
_CHUNK = 8 << 20


class UnsafeCheckpoint(Exception):
    """A pickle in a checkpoint that would build more than tensors and plain data."""


# ------------------------------------------------------------------ files as written ----------

def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _crc32(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)  # releases the GIL: files hash in parallel threads
    return f"{crc:08x}"


def fsync_files(folder: Path) -> None:
    """Flush every file under `folder` to disk (each rank its own writes, before the rename: a
    node that crashes after the rename must not leave a checkpoint of empty pages)."""
    for path in _files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_manifest(folder: Path) -> None:
    files = _files(folder)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        crcs = list(pool.map(_crc32, files))
    entries = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "crc32": c}
               for p, c in zip(files, crcs)}
    path = folder / MANIFEST
    path.write_text(json.dumps({"format": 1, "files": entries}, indent=1))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_manifest(ckpt: Path) -> str | None:
    try:
        entries = json.loads((ckpt / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} cannot be read ({e})"
    for name, want in entries.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, {want['size']} were written (truncated or replaced)"
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        crcs = dict(zip(entries, pool.map(lambda n: _crc32(ckpt / n), entries)))
    for name, want in entries.items():
        if crcs[name] != want["crc32"]:
            return f"{name} does not hold the bytes that were written (CRC-32 {crcs[name]}, " \
                   f"written {want['crc32']})"
    return None


def _check_safetensors(path: Path) -> str | None:
    """A checkpoint from before manifests: the header parses and its tensors fit the file."""
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (OSError, ValueError, KeyError, TypeError, MemoryError) as e:
        return f"{path.name}: its header cannot be read ({type(e).__name__})"
    size = path.stat().st_size
    return None if size == 8 + n + end else \
        f"{path.name} is {size} bytes, its header describes {8 + n + end} (truncated)"


# ------------------------------------------------------------------ pickles -------------------

def _dcp_classes() -> set[tuple[str, str]]:
    import torch.distributed.checkpoint.metadata as md

    mod = md.__name__
    own = {(mod, n) for n, v in vars(md).items() if isinstance(v, type) and v.__module__ == mod}
    return own | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                  ("torch.serialization", "_get_layout"), ("torch", "Size"),
                  ("collections", "OrderedDict"), ("pathlib", "PosixPath"),
                  ("pathlib", "WindowsPath"), ("pathlib._local", "PosixPath"),
                  ("pathlib._local", "WindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    allowed: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) not in self.allowed and not dtype:
            raise UnsafeCheckpoint(f"it would build {module}.{name}")
        return super().find_class(module, name)


def _check_dcp(folder: Path) -> None:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    _MetadataUnpickler.allowed = _MetadataUnpickler.allowed or _dcp_classes()
    meta_path = folder / ".metadata"
    try:
        with meta_path.open("rb") as f:
            meta = _MetadataUnpickler(f).load()
    except UnsafeCheckpoint as e:
        raise UnsafeCheckpoint(f"{meta_path}: {e}") from None
    except Exception as e:
        raise UnsafeCheckpoint(f"{meta_path}: not DCP metadata ({type(e).__name__}: {e})") from None
    for index, info in meta.storage_data.items():  # the non-tensor items, torch.save'd
        if not isinstance(meta.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        where = folder / info.relative_path
        if getattr(info, "transform_descriptors", None):
            raise UnsafeCheckpoint(f"{where}: item {index.fqn} is stored transformed "
                                   f"({info.transform_descriptors}); cannot check it")
        with where.open("rb") as f:
            f.seek(info.offset)
            blob = io.BytesIO(f.read(info.length))
        _weights_only(blob, f"{where} (item {index.fqn})")


def _deepspeed_classes() -> list:
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _weights_only(source, name: str, extra: list | None = None) -> None:
    try:
        with torch.serialization.safe_globals(extra or []):
            torch.load(source, map_location="cpu", weights_only=True,
                       mmap=isinstance(source, (str, Path)))  # mmap: shards stay on disk
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(f"{name}: {str(e).splitlines()[0][:200]}") from None


def check_pickles(ckpt: Path) -> None:
    """Raise UnsafeCheckpoint naming the file when a shard of `ckpt` would build anything but
    tensors and plain data (or a library's own plain records, listed above)."""
    ckpt = Path(ckpt)
    if (ckpt / "dcp").is_dir():
        _check_dcp(ckpt / "dcp")
    if (ckpt / "deepspeed").is_dir():
        extra = _deepspeed_classes()
        for path in sorted((ckpt / "deepspeed").rglob("*.pt")):
            _weights_only(path, str(path), extra)


# ------------------------------------------------------------------ the verdict ---------------

def problem(ckpt: Path) -> str | None:
    """Why `ckpt` must not be resumed from or read (one line), or None when it is intact."""
    ckpt = Path(ckpt)
    if not (ckpt / "trainer_state.pt").is_file():
        return "trainer_state.pt is missing"
    if (ckpt / MANIFEST).is_file():
        found = _check_manifest(ckpt)
    else:  # written before manifests: what can be checked without one
        found = next(filter(None, (_check_safetensors(p)
                                   for p in sorted(ckpt.glob("*.safetensors")))), None)
    if found:
        return found
    if not any((ckpt / f).is_file() for f in WEIGHT_FILES) and \
            not any((ckpt / d).is_dir() for d in SHARD_DIRS):
        return f"it holds no weights (none of {', '.join(WEIGHT_FILES[:3])}, no shards)"
    try:
        check_pickles(ckpt)
    except UnsafeCheckpoint as e:
        return f"refusing to load {e}: it holds objects other than tensors and plain data"
    return None
