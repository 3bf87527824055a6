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
from typing import Any

from mmrl.data.chat import read_chat
from mmrl.data.sources import RecordError, open_table, per_video  # noqa: F401  (re-exported)
from mmrl.registry import Registry
from mmrl.types import Sample

FORMATS: Registry = Registry("data format")
MEDIA_KINDS = ("images", "videos", "audios")
FULL_MEDIA = {f"full_{kind}": kind for kind in MEDIA_KINDS}  # originals for tools, per media kind
RESERVED = {"id", "task", "prompt", "messages", "conversations", "solution", "system",
            *MEDIA_KINDS}


def _media_list(record: dict, key: str, source: str, base: Path) -> list[str]:
    value = record.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{source}: '{key}' must be a path or a list of paths, got {value!r:.80}")
    return [v if Path(v).is_absolute() else str(base / v) for v in value]


def _messages(record: dict, source: str, n_media: dict[str, int]) -> list[dict]:
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
@FORMATS.register("sharegpt")
def to_sample(record: Any, source: str, base_dir: Path) -> Sample:
    """The native schema (above) -> Sample; chats (`messages`, or ShareGPT `conversations`) as
    mmrl/data/chat.py reads them: the last assistant turn is the answer, never the prompt."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: a record must be a JSON object, got {type(record).__name__}")
    media = {k: _media_list(record, k, source, base_dir) for k in MEDIA_KINDS}
    solution = record.get("solution")
    if record.get("messages") or record.get("conversations"):
        messages, answer, media = read_chat(record, source, base_dir, media)
        solution = answer if solution is None else solution
    else:
        messages = _messages(record, source, {k: len(v) for k, v in media.items()})
    if solution is None:
        raise RecordError(f"{source}: missing 'solution' (or, in a chat, a last assistant turn "
                          f"holding the answer)")
    fields = {k: v for k, v in record.items() if k not in RESERVED}
    fields.update(_tool_fields(record, source, base_dir, media))
    return Sample(
        id=str(record.get("id", source)),
        messages=messages,
        solution=solution,
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
    """Samples adapted from a lazily read table when indexed: a draw reads its record (its
    Parquet row group, its JSONL line) and decodes its embedded media, nothing is held for the
    rest. `format` is the adapter that reads it; `notes` what a user should hear about how it
    was read; `cheap_rows`: any record reads alone (JSON), not its row group (Parquet, Arrow)."""

    def __init__(self, table, convert, base: Path, n: int, fmt: str = "mmrl",
                 notes: list[str] | None = None):
        self.table, self.convert, self.base, self.n = table, convert, base, n
        self.blocks = table.blocks if n == len(table) else None
        self.format, self.notes = fmt, list(notes or [])
        self.cheap_rows = table.columns is None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.convert(*self.table[i % self.n], self.base)


def load_samples(path: str | Path, fmt: str | None = None, max_samples: int | None = None, *,
                 configured: str | None = None, default_split: str | None = None,
                 bad_lines: list[str] | None = None) -> LazySamples:
    """The samples of `path`, read lazily (mmrl/data/sources.py). The record format: `fmt` when
    given (a --format flag), else `configured` (a config's data.format) where it reads the
    file, else detected from the file (mmrl/data/detect.py `resolve_format`). `default_split`:
    the split taken from a dataset folder holding several (data.train: "train"). `bad_lines`: a
    list where JSONL lines that are not JSON are described and left out, instead of raising."""
    from mmrl.data.detect import resolve_format
    from mmrl.data.hub import split_selector

    table = open_table(path, default_split, bad_lines)
    folder = Path(split_selector(str(path))[0])
    base = folder if folder.is_dir() else folder.parent
    n = len(table) if max_samples is None else min(len(table), max_samples)
    if n == 0:
        raise RecordError(f"{path}: no records")
    fmt, note = resolve_format(table, str(path), base, FORMATS, flag=fmt, configured=configured)
    return LazySamples(table, FORMATS.get(fmt), base, n, fmt, [note] if note else [])


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """One JSON object per line: the mmrl record format `load_samples` reads back."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
