"""The one record schema, and reading it from JSONL / JSON / Parquet / HF datasets on disk.

A record (one JSON object per line):

    {"id": "cnt-0001", "task": "counting",
     "prompt": "How many squares?"            # or "messages": [HF chat], media as {"type": "image"}
     "images": ["img/0001.png"], "videos": [], "audios": [],   # paths relative to the file
     "solution": "3",
     ...task fields: "options", "duration", "image_size", ...}

Tool use (docs/tools.md): "tools": ["crop"] names the tools the record offers (default: all the
run configures), and "full_images" / "full_videos" / "full_audios" keep full-resolution
originals beside the media the model is given (tools read these; default: the media itself).

Every malformed record raises `RecordError` naming the file and line, never a silent default.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterator

from mmrl.data.sources import RecordError, open_table, per_video  # noqa: F401  (re-exported)
from mmrl.registry import Registry
from mmrl.types import Sample

FORMATS: Registry = Registry("data format")
MEDIA_KINDS = ("images", "videos", "audios")
FULL_MEDIA = {f"full_{kind}": kind for kind in MEDIA_KINDS}  # originals for tools, per media kind
RESERVED = {"id", "task", "prompt", "messages", "solution", "system", *MEDIA_KINDS}


def iter_records(path: str | Path) -> Iterator[tuple[dict, str]]:
    """Yield (record, "file:line") from JSONL, JSON (list), Parquet (a file or a directory of
    shards), a `datasets` save dir, or a `datasets` name in the local cache (mmrl/data/sources.py)."""
    yield from open_table(path)


def _media_list(record: dict, key: str, source: str, base: Path) -> list[str]:
    value = record.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{source}: '{key}' must be a path or a list of paths, got {value!r:.80}")
    return [v if Path(v).is_absolute() else str(base / v) for v in value]


def _messages(record: dict, source: str, n_media: dict[str, int]) -> list[dict]:
    if record.get("messages"):
        msgs = record["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise RecordError(f"{source}: 'messages' must be a list of {{role, content}} objects")
        return msgs
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise RecordError(f"{source}: needs a non-empty 'prompt' string or 'messages'")
    content = [{"type": kind[:-1]} for kind in MEDIA_KINDS for _ in range(n_media[kind])]
    content.append({"type": "text", "text": prompt})
    msgs = [{"role": "user", "content": content}]
    if record.get("system"):
        msgs.insert(0, {"role": "system", "content": [{"type": "text", "text": record["system"]}]})
    return msgs


@FORMATS.register("mmrl")
def to_sample(record: Any, source: str, base_dir: Path) -> Sample:
    """The native schema (above) -> Sample."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: a record must be a JSON object, got {type(record).__name__}")
    if record.get("solution") is None:
        raise RecordError(f"{source}: missing 'solution'")
    media = {k: _media_list(record, k, source, base_dir) for k in MEDIA_KINDS}
    messages = _messages(record, source, {k: len(v) for k, v in media.items()})
    fields = {k: v for k, v in record.items() if k not in RESERVED}
    fields.update(_tool_fields(record, source, base_dir, media))
    return Sample(
        id=str(record.get("id", source)),
        messages=messages,
        solution=record["solution"],
        task=str(record.get("task") or "default"),
        images=media["images"], videos=media["videos"], audios=media["audios"],
        fields=fields,
        source=source,
    )


def _tool_fields(record: dict, source: str, base: Path, media: dict[str, list[str]]) -> dict:
    """The record's "tools" (checked) and full-resolution media (resolved like its media, one
    original per item of the same kind)."""
    out: dict[str, Any] = {}
    tools = record.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
            raise RecordError(f"{source}: 'tools' must be a list of tool names, got {tools!r:.80}")
        out["tools"] = tools
    for key, kind in FULL_MEDIA.items():
        if record.get(key) is None:
            continue
        paths = _media_list(record, key, source, base)
        if len(paths) != len(media[kind]):
            raise RecordError(f"{source}: '{key}' holds {len(paths)} paths for {len(media[kind])} "
                              f"{kind}; give one original per item (or drop '{key}')")
        out[key] = paths
    return out


class LazySamples(Sequence):
    """Samples adapted from a lazily read table (Parquet, Arrow) when indexed: a draw reads its
    row (row group) and decodes its embedded media, nothing is held for the rest."""

    def __init__(self, table, convert, base: Path, n: int):
        self.table, self.convert, self.base, self.n = table, convert, base, n
        self.blocks = table.blocks if n == len(table) else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.convert(*self.table[i % self.n], self.base)


def load_samples(path: str | Path, fmt: str | None = "mmrl",
                 max_samples: int | None = None) -> Sequence[Sample]:
    """All samples of `path`: a list for JSONL/JSON (every record checked up front), a
    LazySamples for Parquet/Arrow tables. `fmt=None`: mmrl for JSONL/JSON, detected from the
    columns for tables (mmrl/data/detect.py)."""
    from mmrl.data.detect import detect_format

    table = open_table(path)
    if fmt is None:
        fmt = detect_format(table.columns, str(path)) if table.columns is not None else "mmrl"
    convert = FORMATS.get(fmt)
    base = Path(path).parent if not Path(path).is_dir() else Path(path)
    n = len(table) if max_samples is None else min(len(table), max_samples)
    if n == 0:
        raise RecordError(f"{path}: no records")
    if table.columns is not None:
        return LazySamples(table, convert, base, n)
    return [convert(record, source, base) for record, source in table[:n]]


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """One JSON object per line: the mmrl record format `iter_records` reads back."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
