"""Decoded-media cache on disk: the second epoch decodes nothing.

An entry is keyed by the file's identity (absolute path, size, mtime_ns: an edited or replaced
file misses) and the decode parameters (fps, segment, pixel budget, sample rate, ...), hashed.
Values are numpy arrays in an uncompressed .npz: loading one is a read, not a decode. Writes are
atomic (temp file + rename), so concurrent ranks sharing a root never see half an entry; an
unreadable entry counts as a miss and is rewritten. Decode errors are not cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from mmrl.data.media import Video

CACHE_VERSION = 2  # bump when the decoders' output changes for the same parameters (2: qwen-vl-utils frames)


class MediaCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0

    # ------------------------------------------------------------------------------ keys ----
    def key(self, kind: str, path: str | Path, params: dict) -> str:
        st = os.stat(path)
        ident = {"kind": kind, "path": os.path.abspath(path), "size": st.st_size,
                 "mtime_ns": st.st_mtime_ns, "params": params, "version": CACHE_VERSION}
        blob = json.dumps(ident, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:40]

    def _file(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    # ----------------------------------------------------------------------------- store ----
    def get(self, key: str) -> dict[str, np.ndarray] | None:
        file = self._file(key)
        if not file.exists():
            return None
        try:
            with np.load(file, allow_pickle=False) as z:
                return {name: z[name] for name in z.files}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
            file.unlink(missing_ok=True)  # torn or foreign file: decode again
            return None

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        file = self._file(key)
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, file)

    def cached(self, kind: str, path: str | Path, params: dict, decode: Callable,
               pack: Callable[[object], dict], unpack: Callable[[dict], object]):
        key = self.key(kind, path, params)
        arrays = self.get(key)
        if arrays is not None:
            self.hits += 1
            return unpack(arrays)
        self.misses += 1
        value = decode()
        self.put(key, pack(value))
        return value

    # ----------------------------------------------------------------------------- kinds ----
    def video(self, path: str, params: dict, decode: Callable[[], Video]) -> Video:
        def pack(v: Video) -> dict:
            return {"frames": v.frames, "fps": np.float64(v.fps), "duration": np.float64(v.duration),
                    "timestamps": np.asarray(v.timestamps, dtype=np.float64)}

        def unpack(a: dict) -> Video:
            return Video(frames=a["frames"], fps=float(a["fps"]), duration=float(a["duration"]),
                         timestamps=[float(t) for t in a["timestamps"]], path=str(path))

        return self.cached("video", path, params, decode, pack, unpack)

    def audio(self, path: str, params: dict,
              decode: Callable[[], tuple[np.ndarray, bool]]) -> tuple[np.ndarray, bool]:
        def pack(value: tuple[np.ndarray, bool]) -> dict:
            return {"audio": value[0], "truncated": np.bool_(value[1])}

        def unpack(a: dict) -> tuple[np.ndarray, bool]:
            return a["audio"], bool(a["truncated"])

        return self.cached("audio", path, params, decode, pack, unpack)

    # ------------------------------------------------------------------------- reporting ----
    def stats(self) -> dict:
        files = list(self.root.glob("*/*.npz"))
        return {"hits": self.hits, "misses": self.misses, "files": len(files),
                "bytes": sum(f.stat().st_size for f in files)}

    def clear(self) -> None:
        for f in self.root.glob("*/*.npz"):
            f.unlink(missing_ok=True)
