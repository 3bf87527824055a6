"""The one record schema, and reading it from JSONL / JSON / Parquet / HF datasets on disk.

A record (one JSON object per line):

    {"id": "cnt-0001", "task": "counting",
     "prompt": "How many squares?"            # or "messages": [HF chat], media as {"type": "image"}
     "images": ["img/0001.png"], "videos": [], "audios": [],   # paths relative to the file
     "solution": "3",
     ...task fields: "options", "duration", "image_size", ...}

Every malformed record raises `RecordError` naming the file and line, never a silent default.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from mmrl.registry import Registry
from mmrl.types import Sample

FORMATS: Registry = Registry("data format")
MEDIA_KINDS = ("images", "videos", "audios")
RESERVED = {"id", "task", "prompt", "messages", "solution", "system", *MEDIA_KINDS}


class RecordError(ValueError):
    """A record that cannot become a Sample; the message names file:line."""


def iter_records(path: str | Path) -> Iterator[tuple[dict, str]]:
    """Yield (record, "file:line") from JSONL, JSON (list), Parquet, or a `datasets` save dir."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist (generate it with `mmrl data` "
                                f"or set data.generate in the config)")
    if path.is_dir():
        import datasets

        for i, row in enumerate(datasets.load_from_disk(str(path))):
            yield dict(row), f"{path}[{i}]"
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield row, f"{path}[{i}]"
    elif path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise RecordError(f"{path}: expected a JSON list of records")
        for i, row in enumerate(rows):
            yield row, f"{path}[{i}]"
    else:
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line), f"{path}:{lineno}"
                except json.JSONDecodeError as e:
                    raise RecordError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


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
    return Sample(
        id=str(record.get("id", source)),
        messages=messages,
        solution=record["solution"],
        task=str(record.get("task") or "default"),
        images=media["images"], videos=media["videos"], audios=media["audios"],
        fields={k: v for k, v in record.items() if k not in RESERVED},
        source=source,
    )


def load_samples(path: str | Path, fmt: str = "mmrl", max_samples: int | None = None) -> list[Sample]:
    convert = FORMATS.get(fmt)
    base = Path(path).parent if not Path(path).is_dir() else Path(path)
    samples = []
    for record, source in iter_records(path):
        samples.append(convert(record, source, base))
        if max_samples is not None and len(samples) >= max_samples:
            break
    if not samples:
        raise RecordError(f"{path}: no records")
    return samples


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """One JSON object per line: the mmrl record format `iter_records` reads back."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
