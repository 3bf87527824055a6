"""The errors of mmrl/data, at its bottom so every reader can raise them: RecordError (a record
or data file that cannot become a Sample) and MediaError with the checks the media loaders share
(mmrl.data.media, .audio)."""
from __future__ import annotations

from pathlib import Path


class RecordError(ValueError):
    """A record that cannot become a Sample; the message names file:line."""


class MediaError(RuntimeError):
    """A media file that cannot be decoded; the message names record source and file path."""


def fail(source: str, what: str, path: str, reason: str) -> MediaError:
    where = f"{source}: " if source else ""
    return MediaError(f"{where}{what} {path}: {reason}")


def check_file(path: str, what: str, source: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise fail(source, what, path, f"is a folder, not a file (only a video may be a folder "
                                       f"of frames)")
    if not p.is_file():
        raise fail(source, what, path, "file not found")
    if p.stat().st_size == 0:
        raise fail(source, what, path, "file is empty (0 bytes)")
