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
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrl.data.chat import read_chat
from mmrl.data.record_parts import (OPTION_PREFIX, check_model_tokens, lettered_options,
                                    media_content, media_ref, unwrap)
from mmrl.data.sources import RecordError, open_table, per_video  # noqa: F401  (re-exported)
from mmrl.registry import Registry
from mmrl.types import Sample

FORMATS: Registry = Registry("data format")
MEDIA_KINDS = ("images", "videos", "audios")
FULL_MEDIA = {f"full_{kind}": kind for kind in MEDIA_KINDS}  # originals for tools, per media kind
SINGULAR = {"images": "image", "videos": "video", "audios": "audio"}  # aliases the schema reads
OPTION_KEYS = ("options", "choices")
TRANSCRIPT_KEYS = ("transcript", "text")  # an audio record's answer when it has no 'solution'
RESERVED = {"id", "task", "prompt", "messages", "conversations", "solution", "system",
            "show_options",
            *MEDIA_KINDS, *SINGULAR.values()}


def _media_list(record: dict, key: str, source: str, base: Path) -> list[str]:
    """The items of a media list (or of its singular alias: "image" for "images"), each in any
    form media_sources.py accepts (paths, URLs, data: URIs, base64, HF dicts)."""
    value = record.get(key)
    alias = SINGULAR.get(key)
    if alias is not None and record.get(alias) not in (None, "", []):
        if value not in (None, "", []):
            raise RecordError(f"{source}: both {alias!r} and {key!r} hold media; keep one list")
        key, value = alias, record[alias]
    if value in (None, "", []):
        return []
    items = value if isinstance(value, list) else [value]
    return [media_ref(v, base, source, key) for v in items]


def _messages(record: dict, source: str, media: dict[str, list[str]]) -> list[dict]:
    """A native prompt as one user turn: `<image>` / `<video>` / `<audio>` marks in it place the
    media there (their count must match the record's items); without marks, media go first."""
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise RecordError(f"{source}: needs a non-empty 'prompt' string or 'messages'")
    for kind in MEDIA_KINDS:
        marks = len(re.findall(f"<{kind[:-1]}>", prompt))
        if marks and marks != len(media[kind]):
            raise RecordError(f"{source}: the prompt has {marks} <{kind[:-1]}> mark(s) but the "
                              f"record lists {len(media[kind])} in {kind!r}; give one item per "
                              f"mark (or no marks: the media then go first)")
    content = media_content(with_options(prompt, record, source),
                           {k: len(v) for k, v in media.items()}, source)
    msgs = [{"role": "user", "content": content}]
    if record.get("system"):
        msgs.insert(0, {"role": "system", "content": [{"type": "text", "text": record["system"]}]})
    return msgs


def with_options(prompt: str, record: dict, source: str) -> str:
    """The prompt with the record's `options` / `choices` under it as the anchors render them
    ("Options:" and "A. text" lines), unless the prompt already shows every option or the
    record says `"show_options": false` (the options then serve the rewards only)."""
    if record.get("show_options") is False:
        return prompt
    key = next((k for k in OPTION_KEYS if isinstance(record.get(k), (list, dict)) and record[k]),
               None)
    if key is None:  # none, or a string the prompt author formatted: left as it is
        return prompt
    options = lettered_options(record[key], f"{source}: {key!r}")
    if all(_shown(i, o, prompt) for i, o in enumerate(options)):
        return prompt
    return f"{prompt.rstrip()}\nOptions:\n" + "\n".join(options)


def _shown(i: int, option: str, prompt: str) -> bool:
    """Whether the prompt lists this option already: as "B. text" / "(B) text", or its text alone
    when that is too long to appear by chance (a bare "2" is in many questions)."""
    body = OPTION_PREFIX.sub("", option, count=1).strip()
    lettered = rf"[\(\[]?{chr(65 + i)}[\)\].:]\s*{re.escape(body)}"
    return bool(re.search(lettered, prompt, re.I)) or (len(body) > 3 and body.lower() in
                                                       prompt.lower())


@FORMATS.register("mmrl")
@FORMATS.register("sharegpt")
def to_sample(record: Any, source: str, base_dir: Path) -> Sample:
    """The native schema (above) -> Sample; chats (`messages`, or ShareGPT `conversations`) as
    mmrl/data/chat.py reads them: the last assistant turn is the answer, never the prompt."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: a record must be a JSON object, got {type(record).__name__}")
    media = {k: _media_list(record, k, source, base_dir) for k in MEDIA_KINDS}
    solution = record.get("solution")
    if solution is None and media["audios"]:  # ASR columns (LibriSpeech's text, a transcript)
        solution = next((record[k] for k in TRANSCRIPT_KEYS if record.get(k) is not None), None)
    if record.get("messages") or record.get("conversations"):
        messages, answer, media = read_chat(record, source, base_dir, media)
        solution = answer if solution is None else solution
    else:
        messages = _messages(record, source, media)
    if solution is None:
        raise RecordError(f"{source}: missing 'solution' (or, in a chat, a last assistant turn "
                          f"holding the answer)")
    fields = {k: v for k, v in record.items() if k not in RESERVED}
    fields.update(_tool_fields(record, source, base_dir, media))
    return Sample(
        id=str(record.get("id", source)),
        messages=messages,
        solution=unwrap(solution),  # "<answer>B</answer>": unwrapped once, never wrapped twice
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
    return LazySamples(table, checked(FORMATS.get(fmt), fmt), base, n, fmt,
                       [note] if note else [])


def checked(adapt, fmt: str):
    """The adapter with the rules every format shares: no media under a key the format does not
    read (detect.py `check_media_keys`), no model media tokens in the text."""
    from mmrl.data.detect import check_media_keys

    def convert(record: Any, source: str, base: Path) -> Sample:
        check_media_keys(record, fmt, source)
        sample = adapt(record, source, base)
        check_model_tokens(sample)
        return sample

    return convert


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """One JSON object per line: the mmrl record format `load_samples` reads back."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
