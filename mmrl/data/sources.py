"""Where records come from, read lazily: Parquet files or directories of shards by row group,
Arrow datasets (`datasets.save_to_disk` dirs, `datasets` names in the local cache) by row through
their memory map, JSONL files and JSON lists by byte offset (json_tables.py), dataset folders as
a Hub repository is downloaded split by split (hub.py), WebDataset `.tar` shards by byte offset
(webdataset.py: one shard, a folder of them, or a brace pattern `shard-{000..009}.tar`).

A table is a Sequence of (record, "file[row]") with `columns` (None where records may differ)
and `blocks`: row counts of consecutive runs that are cheap to read together (Parquet row groups),
which the prompt sampler shuffles as blocks so a draw rarely reads a second row group.
"""
from __future__ import annotations

import bisect
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


from mmrl.data.media_errors import RecordError


class ParquetTable(Sequence):
    """Rows of one Parquet file or a sorted directory of `*.parquet` shards. Only the footers are
    read up front; a row reads (and keeps, as Arrow buffers) its one row group."""

    def __init__(self, files: list[Path]):
        import pyarrow.parquet as pq

        self.files, self._pq = files, pq
        self.groups: list[tuple[int, int, int]] = []  # (file index, row group, its first row)
        self.blocks: list[int] = []
        cols = None
        for fi, f in enumerate(files):
            meta = pq.ParquetFile(f).metadata
            names = meta.schema.to_arrow_schema().names
            if cols is not None and names != cols:
                raise RecordError(f"{f}: columns {names} differ from {files[0].name}'s {cols}")
            cols = names
            first = 0
            for rg in range(meta.num_row_groups):
                if meta.row_group(rg).num_rows:
                    self.groups.append((fi, rg, first))
                    self.blocks.append(meta.row_group(rg).num_rows)
                    first += meta.row_group(rg).num_rows
        self.columns = cols or []
        self._starts = [0]
        for n in self.blocks:
            self._starts.append(self._starts[-1] + n)
        self._cached: tuple[int, Any] = (-1, None)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> tuple[dict, str]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        g = bisect.bisect_right(self._starts, i) - 1
        fi, rg, first = self.groups[g]
        if self._cached[0] != g:
            self._cached = (g, self._pq.ParquetFile(self.files[fi]).read_row_group(rg))
        off = i - self._starts[g]
        return self._cached[1].slice(off, 1).to_pylist()[0], f"{self.files[fi]}[{first + off}]"


class ArrowTable(Sequence):
    """A `datasets.Dataset` (memory-mapped Arrow): rows are read, and images decoded, on access."""

    def __init__(self, ds, name: str):
        self.ds, self.name, self.columns, self.blocks = ds, name, list(ds.column_names), None

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[dict, str]:
        return dict(self.ds[int(i)]), f"{self.name}[{i % len(self)}]"


class ListTable(list):
    columns = None
    blocks = None


def _cached_dataset(name: str) -> Sequence:
    """`org/name[:split]` (split default "train") from the local caches, offline: the Parquet
    shards of a hub snapshot (huggingface_hub's cache, streamed like any shard directory), else a
    dataset `datasets.load_dataset` prepared before (its Arrow cache). Nothing downloads."""
    from mmrl.data.hub import folder_splits

    repo, _, split = name.partition(":")
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(repo, repo_type="dataset", local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the hub cache (or no huggingface_hub)
        snap = None
    if snap is not None and folder_splits(snap):  # data files, split by split
        return _folder_table(snap, split or None, "train")
    split = split or "train"
    import datasets

    with _offline():
        try:
            ds = datasets.load_dataset(repo, split=split)
        except Exception as e:  # noqa: BLE001 - datasets raises many types for "not cached"
            raise FileNotFoundError(
                f"data file {name}: not a path, and not a dataset in the local datasets cache "
                f"({type(e).__name__}: {str(e)[:200]}). Download it once (datasets.load_dataset"
                f"('{repo}')) or point at a file/directory") from None
    return ArrowTable(ds, name)


class _offline:
    def __enter__(self):
        import datasets.config as dc

        self._saved = dc.HF_HUB_OFFLINE
        dc.HF_HUB_OFFLINE = True

    def __exit__(self, *exc):
        import datasets.config as dc

        dc.HF_HUB_OFFLINE = self._saved


def open_table(path: str | Path, default_split: str | None = None,
               bad_lines: list[str] | None = None) -> Sequence:
    """The records at `path` (see the module docstring), read lazily. A folder laid out as a Hub
    dataset repository gives one split (mmrl/data/hub.py): `DIR:validation` names it, else
    `default_split` (data.train asks for "train") where the folder holds several. `bad_lines`:
    see file_table."""
    from mmrl.data.hub import split_selector
    from mmrl.data.webdataset import ShardTable, expand_pattern, is_shard

    path, split = split_selector(str(path))
    p = Path(path)
    if not p.exists() and is_shard(path) and any(c in str(path) for c in "{*?["):
        return ShardTable(expand_pattern(str(path)))
    if not p.exists():
        if "/" in str(path) and not str(path).startswith((".", "/")) and p.suffix == "":
            return _cached_dataset(str(path))
        raise FileNotFoundError(f"data file {p} does not exist (generate it with `mmrl data` "
                                f"or set data.generate in the config)")
    if p.is_dir():
        return _folder_table(p, split, default_split)
    return file_table(p, bad_lines)


def file_table(p: Path, bad_lines: list[str] | None = None) -> Sequence:
    """One data file: Parquet by row group, JSON / JSONL by byte offset (json_tables.py), a
    Charades-style JSON dict of videos whole (such files are small). A JSONL line that is not
    JSON raises, or with `bad_lines` (a list) is described there and left out."""
    from mmrl.data.json_tables import JsonListTable, JsonlTable, utf8
    from mmrl.data.webdataset import ShardTable, is_shard

    if p.suffix == ".parquet":
        return ParquetTable([p])
    if is_shard(p):
        return ShardTable([p])
    if p.suffix != ".json":
        return JsonlTable(p, bad_lines)
    with p.open("rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"{"):
        return JsonListTable(p)
    try:
        rows = json.loads(utf8(p.read_bytes(), p))
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # one object per line under a .json name
            return JsonlTable(p, bad_lines)
        raise RecordError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    return ListTable(per_video(rows, p))


def _folder_table(p: Path, split: str | None, default_split: str | None) -> Sequence:
    from mmrl.data.hub import choose_split, folder_splits
    from mmrl.data.json_tables import ConcatTable
    from mmrl.data.webdataset import ShardTable

    if (p / "state.json").is_file():  # datasets.save_to_disk of one Dataset
        import datasets

        return ArrowTable(datasets.load_from_disk(str(p)), str(p))
    files = choose_split(p, folder_splits(p), split, default_split)
    if len(files) == 1 and files[0].is_dir():  # a DatasetDict's split
        import datasets

        return ArrowTable(datasets.load_from_disk(str(files[0])), str(files[0]))
    for kind, table in ((".parquet", ParquetTable), (".tar", ShardTable)):
        if all(f.suffix == kind for f in files):
            return table(files)
        if any(f.suffix == kind for f in files):
            raise RecordError(f"{p}: one split mixes {kind} files with others ({files[0].name}, "
                              f"...); point at one kind")
    tables = [file_table(f) for f in files]
    return tables[0] if len(tables) == 1 else ConcatTable(tables)


def per_video(rows: dict, path: Path) -> Iterator[tuple[dict, str]]:
    """Charades-style annotations (Time-R1, VideoChat-R1, TimeZero): {video id: {"duration",
    "timestamps": [[s, e], ...], "sentences": [...]}} -> one record per (timestamp, sentence)."""
    for vid, entry in rows.items():
        where = f"{path}[{vid!r}]"
        if not isinstance(entry, dict):
            raise RecordError(f"{where}: expected a list of records, or a dict of videos whose "
                              f"values are objects")
        stamps, sents = entry.get("timestamps"), entry.get("sentences")
        if not isinstance(stamps, list) or not isinstance(sents, list) or len(stamps) != len(sents):
            raise RecordError(f"{where}: needs 'timestamps' and 'sentences' lists of equal length")
        rest = {k: v for k, v in entry.items() if k not in ("timestamps", "sentences")}
        for i, (stamp, sent) in enumerate(zip(stamps, sents)):
            yield ({"video_id": vid, **rest, "timestamp": stamp, "sentence": sent,
                    "id": f"{vid}_{i}"}, f"{where}[{i}]")
