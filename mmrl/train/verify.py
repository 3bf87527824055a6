"""What a checkpoint must pass before a run resumes from it or a tool reads it.

- Every file as it was written: `manifest.json` lists each file's size and CRC-32, written last
  into the checkpoint's temp dir (after every file was fsynced), so a truncated, emptied, missing
  or bit-flipped file is found before anything loads it. CRC-32 finds damage, not forgery: what
  a crafted file may do is bounded by the next point.
- Nothing but tensors and plain data in its pickles. `trainer_state.pt` loads with
  `torch.load(weights_only=True)` (checkpoint.py). Sharded weights are read by their
  libraries, which ask for full pickle: torch DCP's `FileSystemReader` unpickles `dcp/.metadata`
  and its planner `torch.load(weights_only=False)`s the non-tensor items, DeepSpeed's engine
  and `zero_to_fp32` `torch.load(weights_only=False)` every shard. So they are first read here
  the safe way: the metadata through an unpickler that builds only DCP's metadata records,
  torch.Size, dtypes and paths; every other pickle with `weights_only=True` (plus DeepSpeed's
  four plain record classes). A file that needs anything else is refused, naming it.
- Its own files only. Every path is resolved: a symbolic link (to a file or a folder) is
  refused, since mmrl writes none and a link lets a checked name stand for an unchecked file
  (Python 3.11's `rglob` does not descend a linked folder that `is_dir()` follows); so is a file
  with more than one hard link (another name could change it after the check), a file the
  manifest does not list (an extra or renamed shard) and a DCP item whose path leaves `dcp/`.
- Pickles read the safe way even past this check: `only_weights()` makes every `torch.load`
  inside it (DeepSpeed's engine and `zero_to_fp32`, DCP's planner) `weights_only=True`, and
  `SafeDcpReader` reads DCP metadata through the unpickler below; the loaders run inside them.
- Weights present: a checkpoint without `model.safetensors` (or a LoRA adapter, or shards) would
  resume the base model under step N's optimizer state.
"""
from __future__ import annotations

import contextlib
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

def _entries(folder: Path) -> list[Path]:
    """Every file, folder and link under `folder`, links listed but never followed."""
    found = []
    for top, dirs, files in os.walk(folder, followlinks=False):
        found += [Path(top) / n for n in (*dirs, *files)]
    return sorted(found)


def _files(folder: Path) -> list[Path]:
    return [p for p in _entries(folder) if p.is_file() and not p.is_symlink()
            and p.name != MANIFEST]


def _check_paths(ckpt: Path) -> str | None:
    """A link, a hard-linked file, or (with a manifest) a file it does not list -> why."""
    real = ckpt.resolve()
    try:
        listed = set(json.loads((ckpt / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        listed = None  # no manifest (an old checkpoint) or a broken one (_check_manifest says)
    for path in _entries(ckpt):
        name = path.relative_to(ckpt).as_posix()
        if path.is_symlink():
            target = path.resolve()
            where = "outside the checkpoint" if not target.is_relative_to(real) else "inside it"
            return f"{name} is a symbolic link to {target} ({where}); a checkpoint holds its " \
                   f"own files only: copy the files in (cp -rL) to load it"
        info = path.lstat()
        if path.is_file() and info.st_nlink > 1:
            return f"{name} has {info.st_nlink} hard links (another name can change it after " \
                   f"it is checked); copy the checkpoint (cp -r) to load it"
        if listed is not None and path.is_file() and name != MANIFEST and name not in listed:
            return f"{name} is not in {MANIFEST} (an extra or renamed file); remove it, or " \
                   f"resume another checkpoint"
    return None


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
        if not path.resolve().is_relative_to(ckpt.resolve()):
            return f"{MANIFEST} lists {name}, outside the checkpoint"
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

    meta_path = folder / ".metadata"
    meta = _read_metadata(meta_path)
    for index, info in meta.storage_data.items():  # the non-tensor items, torch.save'd
        if not (folder / info.relative_path).resolve().is_relative_to(folder.resolve()):
            raise UnsafeCheckpoint(f"{meta_path}: item {index.fqn} is stored at "
                                   f"{info.relative_path}, outside {folder}")
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
    if (ckpt / "pytorch_model.bin").is_file():  # a replicated model saved as a pickle
        _weights_only(ckpt / "pytorch_model.bin", str(ckpt / "pytorch_model.bin"))
    if (ckpt / "dcp").is_dir():
        _check_dcp(ckpt / "dcp")
    if (ckpt / "deepspeed").is_dir():
        extra = _deepspeed_classes()
        for path in _files(ckpt / "deepspeed"):  # DeepSpeed opens its shards by name (*.pt)
            if path.suffix == ".pt":
                _weights_only(path, str(path), extra)


def _read_metadata(path: Path):
    _MetadataUnpickler.allowed = _MetadataUnpickler.allowed or _dcp_classes()
    try:
        with path.open("rb") as f:
            return _MetadataUnpickler(f).load()
    except UnsafeCheckpoint as e:
        raise UnsafeCheckpoint(f"{path}: {e}") from None
    except Exception as e:
        raise UnsafeCheckpoint(f"{path}: not DCP metadata ({type(e).__name__}: {e})") from None


def safe_dcp_reader(folder: Path):
    """torch DCP's FileSystemReader, its metadata read through the unpickler above (torch reads
    it with plain `pickle.load`)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeDcpReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            meta = _read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return SafeDcpReader(str(folder))


@contextlib.contextmanager
def only_weights():
    """Inside: every `torch.load` (DeepSpeed's, DCP's, anyone's) is `weights_only=True`, with
    DeepSpeed's plain records allowed, whatever its caller asked for; a pickle that builds
    anything else raises `pickle.UnpicklingError` instead of running."""
    try:
        extra = _deepspeed_classes()
    except ImportError:
        extra = []
    original = torch.load

    def load(*args, **kwargs):
        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(extra):
            return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


# ------------------------------------------------------------------ the verdict ---------------

def problem(ckpt: Path, need_state: bool = True) -> str | None:
    """Why `ckpt` must not be resumed from or read (one line), or None when it is intact.
    `need_state=False`: a checkpoint read for its weights only (consolidate)."""
    ckpt = Path(ckpt)
    if need_state and not (ckpt / "trainer_state.pt").is_file():
        return "trainer_state.pt is missing"
    found = _check_paths(ckpt)
    if found:
        return found
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
