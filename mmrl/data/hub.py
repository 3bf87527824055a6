"""Splits of a dataset folder laid out as a Hub dataset repository is downloaded: `README.md` and
`data/train-00000-of-00002.parquet`, `data/validation-*`, `data/test-*` (or `train/0000.parquet`,
or the data files the README's `configs:` front matter lists), and `datasets.save_to_disk`
folders of a DatasetDict (`dataset_dict.json` + one folder per split). WebDataset shards split
the same way: `train/shard-000.tar`, `shard-train-000.tar`, `shard-val-000.tar`.

A split is chosen, never merged with another: `DIR:validation` names one; without a name a
folder with one split gives it, and a folder with several gives the caller's default split
(`data.train` asks for "train") or else an error that lists them.
"""
from __future__ import annotations

import re
from pathlib import Path

from mmrl.data.media_errors import RecordError

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".tar")
# File-name keywords of each split, as `datasets` reads a repository without a loading script.
SPLIT_WORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "val", "dev"),
               "test": ("test", "testing", "eval", "evaluation")}
_SPLIT_OF = {word: split for split, words in SPLIT_WORDS.items() for word in words}
# A split keyword is a word between separators, as `datasets` matches it: "train-00000-of-00002",
# "test", "dev_0", "shard-train-000"; not "pretrain" or "interval".
_WORD = re.compile(r"(?:^|(?<=[-._ 0-9]))([A-Za-z]+)(?=$|[-._ 0-9])")


def split_selector(path: str) -> tuple[str, str | None]:
    """"DIR:validation" -> ("DIR", "validation") when DIR is a folder and the whole string is
    no path; anything else -> (path, None)."""
    head, sep, tail = str(path).rpartition(":")
    if sep and tail and "/" not in tail and not Path(path).exists() and Path(head).is_dir():
        return head, tail
    return str(path), None


def folder_splits(folder: Path) -> dict[str, list[Path]]:
    """{split: its data files (or its save_to_disk folder)}, from the README's `configs:`, else
    from split keywords in file and folder names, else every data file as "train"."""
    if (folder / "dataset_dict.json").is_file():
        return {d.name: [d] for d in sorted(folder.iterdir()) if (d / "state.json").is_file()}
    splits = _readme_splits(folder)
    if splits:
        return splits
    named = _named_files(folder)
    if named:  # train, validation, test first, as listed in messages
        order = list(SPLIT_WORDS)
        return dict(sorted(named.items(), key=lambda kv: order.index(kv[0])))
    files = _data_files(folder)
    return {"train": files} if files else {}


def choose_split(folder: Path, splits: dict[str, list[Path]], named: str | None,
                 default: str | None) -> list[Path]:
    """The files of the split asked for (module docstring); errors list the splits there are."""
    where = f"{folder}"
    listing = ", ".join(f"{s} ({len(f)} file{'s' * (len(f) != 1)})" for s, f in splits.items())
    if not splits:
        raise RecordError(f"{where}: a dataset folder with no data files (*.parquet, *.jsonl, "
                          f"*.json, *.tar) under it")
    want = _SPLIT_OF.get(named, named) if named else None
    if want is None and len(splits) == 1:
        return next(iter(splits.values()))
    want = want or default
    if want is None:
        raise RecordError(f"{where} holds several splits: {listing}. Name one, e.g. "
                          f"{folder}:{next(iter(splits))} (splits are never merged)")
    if want not in splits:
        raise RecordError(f"{where}: no split {want!r}; it holds {listing}. Name one, e.g. "
                          f"{folder}:{next(iter(splits))}")
    return splits[want]


def _data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts)
                  and p.name not in ("dataset_info.json", "state.json", "dataset_dict.json"))


def _split_of(file: Path, folder: Path) -> str | None:
    """The split a file belongs to by its name, or by the name of a folder it is in."""
    for name in (file.stem, *reversed(file.relative_to(folder).parent.parts)):
        for m in _WORD.finditer(name):
            if m.group(1).lower() in _SPLIT_OF:
                return _SPLIT_OF[m.group(1).lower()]
    return None


def _named_files(folder: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for f in _data_files(folder):
        split = _split_of(f, folder)
        if split is not None:
            out.setdefault(split, []).append(f)
    return out


def _readme_splits(folder: Path) -> dict[str, list[Path]]:
    """The default (or only) config's `data_files` in README.md's YAML front matter."""
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    import yaml

    try:
        meta = yaml.safe_load(text[3:text.find("\n---", 3)]) or {}
    except yaml.YAMLError as e:
        raise RecordError(f"{readme}: its front matter is not YAML ({e})") from None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(configs, list) or not configs:
        return {}
    chosen = [c for c in configs if isinstance(c, dict) and (c.get("default")
                                                              or c.get("config_name") == "default")]
    if not chosen and len(configs) > 1:
        names = [c.get("config_name") for c in configs if isinstance(c, dict)]
        raise RecordError(f"{readme} lists configs {names} and none is the default; point "
                          f"data.train at the folder of one config's files instead")
    files = (chosen or configs)[0].get("data_files")
    entries = ([{"split": k, "path": v} for k, v in files.items()] if isinstance(files, dict)
               else [{"split": "train", "path": files}] if isinstance(files, str) else files or [])
    out: dict[str, list[Path]] = {}
    for entry in entries:
        patterns = entry.get("path") if isinstance(entry, dict) else None
        for pattern in [patterns] if isinstance(patterns, str) else patterns or []:
            found = sorted(p for p in folder.glob(pattern) if p.is_file())
            out.setdefault(str(entry.get("split", "train")), []).extend(found)
    return {s: f for s, f in out.items() if f}
