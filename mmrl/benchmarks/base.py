"""What every benchmark is made of: a local copy in its Hub layout, lmms-eval's prompt, its
scorer. A benchmark module defines one `Benchmark`; the runner (runner.py) does the rest.

Nothing here fetches: a benchmark reads the files a user downloaded once, and a missing copy is
one line naming the command that downloads it and where it must land."""
from __future__ import annotations

import glob
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mmrl.data.record_parts import media_ref
from mmrl.types import Sample


class MissingCopy(SystemExit):
    """A benchmark's local copy is absent or holds no file of its split (one line, exit code)."""


@dataclass
class Context:
    """What a scorer may need beyond the row and the text: the model family's box convention,
    the run's image budget (Qwen2.5-VL's boxes are in its resized frame) and one random stream
    (lmms-eval's parsers pick a random letter when they find none: seeded, so reruns agree)."""

    box_coords: str = "norm1"
    min_pixels: int | None = None
    max_pixels: int | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str  # what it is, with lmms-eval's task name
    lmms_task: str  # the lmms-eval task it matches
    hub: str  # the dataset repo a user downloads
    files: str  # glob of the split's files under the copy's root
    metric: str  # the headline metric key of `aggregate`
    to_sample: Callable[[dict, Path, str, Context], Sample]  # row, root, source, ctx
    score: Callable[[dict, str, Context], dict]  # row, completion -> per-sample result
    aggregate: Callable[[list[dict]], dict]  # per-sample results -> metrics
    write_fixture: Callable[[Path, int, int], None]  # root, n rows, seed: a copy in the layout
    max_new_tokens: int = 128  # the task's generation_kwargs (or lmms-eval's default)
    judge: str = ""  # metrics that need a judge model (out of scope: not computed)
    reader: str = "parquet"  # parquet | json (a JSON list / JSON Lines file)
    notes: str = ""  # what differs from lmms-eval, said once in the output
    prepare: Callable[[list[dict]], list[dict]] = list  # the task's process_docs (e.g. explode)

    def download(self, root: Path | str = "PATH") -> str:
        return f"huggingface-cli download {self.hub} --repo-type dataset --local-dir {root}"

    def rows(self, root: Path) -> list[dict]:
        """The split's rows in file order, or MissingCopy naming what to download and where."""
        found = sorted(glob.glob(str(root / self.files), recursive=True))
        if not found:
            raise MissingCopy(f"benchmark {self.name!r}: no {self.files} under {root}; download "
                              f"it once: `{self.download(root)}`")
        return self.prepare([row for f in found for row in READERS[self.reader](Path(f))])


def _parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _json(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else list(data.values())


READERS = {"parquet": _parquet, "json": _json}


def chat(text: str, images: int = 0, videos: int = 0, audios: int = 0) -> list[dict]:
    """One user turn: the media first, then the text (how lmms-eval's chat models send them)."""
    content = ([{"type": "image"}] * images + [{"type": "video"}] * videos
               + [{"type": "audio"}] * audios + [{"type": "text", "text": text}])
    return [{"role": "user", "content": content}]


def medium(value: Any, root: Path, source: str, key: str) -> str:
    """A Hub media cell ({"bytes", "path"}, bytes or a relative path) as a local path."""
    return media_ref(value, root, source, key)


def png_cell(width: int, height: int, seed: int) -> dict:
    """An image cell as `datasets` writes one to Parquet: {"bytes": PNG, "path": name}."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": f"{seed}.png"}


def write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def percent(scores: list[float]) -> float:
    return sum(scores) * 100.0 / len(scores) if scores else float("nan")
