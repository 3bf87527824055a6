"""WebDataset shards: plain `.tar` files whose members are named KEY.EXT, one sample per key.

    000123.json   the record, in any format mmrl reads (native, vlm_r1, easyr1, ...: detect.py)
    000123.jpg    its media, by extension: IMAGE_EXTS, VIDEO_EXTS, AUDIO_EXTS below
    000123.txt    a text member: a record field named by its extension ("txt"), unless the
                  record already holds that field with another value (then an error)

As the webdataset library groups them: a member's key is its path up to the first dot of its
file name, its extension the rest (lower-cased), and the members of a sample are consecutive.
Other members (`.npy`, `.pth`, names without a dot) are not read.

Opening a shard reads its tar headers only (`_ustar_members`; tarfile for header kinds it leaves;
the webdataset package streams shards in order, while the prompt sampler draws any sample at
any time and resumes at an index), keeping per sample its shard, key and each member's
extension, offset and size: ~200 bytes a sample (20 MB for 100k, docs/data.md). A record is read when drawn: its JSON, and its media members'
bytes, which are written to the embedded-media folder (record_parts.embedded_dir: content-
addressed, the member's name kept) and reach the model as any embedded bytes do, through the
media loaders, their guards (header size check before decode), the media cache and the
bad-sample policy. A sample's source is "SHARD:KEY", so a corrupt member is reported as
`train/shard-000.tar:000123: cannot decode image .../<hash>-000123.jpg: ...`.

How a record's media reach its members (`resolve_media`):
- a media value naming a member refers to it: the extension (`"image": "jpg"`, `"videos":
  ["mp4"]`), or the member's name (`"image": "000123.jpg"`, also as a chat part's own media);
  a value that names a member the sample lacks is an error naming shard, key and the members;
- a media member the record names nowhere fills the plural key of its kind (`images`, `videos`,
  `audios`: the native adapter's, which easyr1/r1v, vlm_r1, r1_aqa and time_r1 read for the
  kinds they take) when the record names no media of that kind; when it does name some, the unnamed member is an error
  (never a silent drop). Video-R1 records name theirs in `path` (`"path": "mp4"`);
- any other value is what it always is: a path relative to the shard's folder.
"""
from __future__ import annotations

import json
import os
import re
import tarfile
from array import array
from itertools import product
from pathlib import Path
from typing import Any

from mmrl.data.json_tables import Rows
from mmrl.data.media_errors import RecordError
from mmrl.data.media_sources import write_once
from mmrl.data.record_parts import embedded_dir

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
VIDEO_EXTS = ("mp4", "webm", "mkv", "avi", "mov", "m4v")
AUDIO_EXTS = ("wav", "flac", "mp3", "ogg", "opus", "m4a", "aac")
KIND_OF_EXT = {**{e: "images" for e in IMAGE_EXTS}, **{e: "videos" for e in VIDEO_EXTS},
               **{e: "audios" for e in AUDIO_EXTS}}
TEXT_EXTS = ("txt", "text", "cls", "caption")
# Record keys whose values may name media members, by the kind of media they hold ("path" is
# Video-R1's and Time-R1's: its kind is the member's). Chat parts are looked at too.
NAMING_KEYS = {"images": ("images", "image", "full_images"),
               "videos": ("videos", "video", "video_path", "full_videos"),
               "audios": ("audios", "audio", "audio_path", "audio_id", "full_audios"),
               None: ("path",)}
COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
_KEY = re.compile(r"^((?:.*/|)[^./][^.]*)\.([^/]*)$")  # webdataset's base_plus_ext
_BRACE = re.compile(r"\{([^{}]*)\}")
_ZERO_BLOCK = bytes(512)  # tar's end of archive: two of them


def is_shard(path: str | Path) -> bool:
    return str(path).endswith((".tar", *COMPRESSED))


def expand_pattern(pattern: str) -> list[Path]:
    """`shard-{000000..000009}.tar` (zero-padded ranges), `{train,extra}-0.tar` and glob
    characters -> the shards, in order; each must exist."""
    parts, names = _BRACE.split(pattern), [""]
    for i, part in enumerate(parts):
        if i % 2 == 0:
            options = [part]
        elif ".." in part:
            lo, _, hi = part.partition("..")
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise RecordError(f"{pattern}: {{{part}}} is not a range such as {{000..009}}")
            options = [f"{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1)]
        else:
            options = part.split(",")
        names = [a + b for a, b in product(names, options)]
    files: list[Path] = []
    for name in names:
        if any(c in name for c in "*?["):
            files += sorted(Path(name).parent.glob(Path(name).name))
        else:
            files.append(Path(name))
    missing = [f for f in files if not f.is_file()]
    if missing or not files:
        raise FileNotFoundError(f"data files {pattern}: {len(missing)} of {len(files)} shards do "
                                f"not exist (first: {missing[0] if missing else 'none matched'})")
    return files


class ShardTable(Rows):
    """The samples of WebDataset shards (module docstring), read by byte offset."""

    columns = None  # records may differ in their keys
    blocks = None  # any sample reads alone (a seek), none needs its neighbours

    def __init__(self, shards: list[Path]):
        self.shards = [Path(s) for s in shards]
        self.shard_of, self.first = array("I"), array("I")
        self.keys: list[str] = []
        self.exts: list[str] = []
        self.offsets, self.sizes = array("q"), array("q")
        for si, shard in enumerate(self.shards):
            self._scan(si, shard)
        self.first.append(len(self.exts))
        self._file, self._open = None, (-1, -1)  # (shard index, pid) of the open handle

    def _scan(self, si: int, shard: Path) -> None:
        if str(shard).endswith(COMPRESSED):
            raise RecordError(f"{shard}: a compressed shard cannot be read by offset; "
                              f"decompress it (e.g. `gunzip`; its media are compressed already)")
        with open(shard, "rb") as f:
            found = _ustar_members(f, shard)
        if found is None:  # a header kind the fast reader leaves to tarfile
            found = _tarfile_members(shard)
        key = None
        for name, offset, size in found:
            m = _KEY.match(name)
            if m is None:
                continue
            ext = m.group(2).lower()
            if m.group(1) != key:
                key = m.group(1)
                self.shard_of.append(si)
                self.first.append(len(self.exts))
                self.keys.append(key)
            elif ext in self.exts[self.first[-1]:]:
                raise RecordError(f"{shard}:{name}: a second {key}.{ext} member in sample {key}")
            self.exts.append(_intern(ext))
            self.offsets.append(offset)
            self.sizes.append(size)

    def __len__(self) -> int:
        return len(self.keys)

    def source(self, i: int) -> str:
        return f"{self.shards[self.shard_of[i]]}:{self.keys[i]}"

    def members(self, i: int) -> dict[str, tuple[int, int]]:
        """{extension: (offset, size)} of sample i."""
        lo, hi = self.first[i], self.first[i + 1]
        return {self.exts[j]: (self.offsets[j], self.sizes[j]) for j in range(lo, hi)}

    def member_bytes(self, i: int) -> dict[str, bytes]:
        """{extension: bytes} of sample i's members, as the webdataset library yields a sample."""
        return {ext: self._read(self.shard_of[i], *at) for ext, at in self.members(i).items()}

    def _read(self, si: int, offset: int, size: int) -> bytes:
        if self._open != (si, os.getpid()):  # one handle; a forked worker opens its own
            if self._file is not None:
                self._file.close()
            self._file, self._open = open(self.shards[si], "rb"), (si, os.getpid())
        self._file.seek(offset)
        return self._file.read(size)

    def _row(self, i: int) -> tuple[dict, str]:
        source, key, si = self.source(i), self.keys[i], self.shard_of[i]
        members = self.members(i)
        if "json" not in members:
            raise RecordError(f"{source}: no {key}.json member (the record; it has "
                              f"{', '.join(f'{key}.{e}' for e in members)})")
        raw = self._read(si, *members["json"])
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RecordError(f"{source}.json: not valid UTF-8 JSON ({e})") from None
        if not isinstance(record, dict):
            raise RecordError(f"{source}.json: a record must be a JSON object, got "
                              f"{type(record).__name__}")
        for ext in members:
            if ext.rpartition(".")[2] in TEXT_EXTS:
                _text_field(record, ext, self._read(si, *members[ext]), source)

        def embed(ext: str) -> str:
            return _embed(self._read(si, *members[ext]), f"{key.rpartition('/')[2]}.{ext}")

        return resolve_media(record, key, list(members), embed, source), source

    def __getstate__(self):  # picklable (a DataLoader worker, a spawned process): no handle
        return {**self.__dict__, "_file": None, "_open": (-1, -1)}


def _ustar_members(f, shard: Path) -> list[tuple[str, int, int]] | None:
    """(name, data offset, size) of every regular file member, from the 512-byte headers (with
    pax `path`/`size` records and GNU long names, as webdataset's and GNU tar's writers make
    them): ~5x faster than tarfile, which builds a TarInfo per member. None where a header is
    of another kind (a pax global header, sparse files, base-256 sizes): tarfile reads those."""
    out, pos, size_all = [], 0, os.fstat(f.fileno()).st_size
    long_name, pax = None, {}
    while True:
        f.seek(pos)
        buf = f.read(512)
        if len(buf) < 512 or buf == _ZERO_BLOCK:
            rest = buf + f.read()
            if not rest or rest.count(0) != len(rest):
                raise RecordError(f"{shard}: the shard ends inside a member's header at byte "
                                  f"{pos}, without tar's end-of-archive blocks (a truncated "
                                  f"copy?)")
            return out
        try:
            stored = int(buf[148:156].strip(b"\0 ") or b"0", 8)
            size = int(buf[124:136].strip(b"\0 ") or b"0", 8)
        except ValueError:
            return None  # base-256 numbers, or not a tar: tarfile says which
        if stored != sum(buf) - sum(buf[148:156]) + 256:
            return None
        kind, data = buf[156:157], pos + 512
        if data + size > size_all:
            name = long_name or pax.get("path") or _header_name(buf)
            raise RecordError(f"{shard}:{name}: the shard ends inside this member (a truncated "
                              f"copy?)")
        if kind in (b"L", b"x"):
            f.seek(data)
            payload = f.read(size)
            if kind == b"L":
                long_name = payload.rstrip(b"\0").decode("utf-8", "surrogateescape")
            else:
                pax = _pax_records(payload)
        elif kind in (b"0", b"\0", b"7"):
            size = int(pax.get("size", size))
            out.append((pax.get("path") or long_name or _header_name(buf), data, size))
            long_name, pax = None, {}
        elif kind not in (b"1", b"2", b"3", b"4", b"5", b"6", b"K"):
            return None
        pos = data + -(-size // 512) * 512


def _header_name(buf: bytes) -> str:
    name = buf[:100].split(b"\0", 1)[0]
    if buf[257:265] == b"ustar\x0000":  # POSIX ustar: a prefix of long paths
        prefix = buf[345:500].split(b"\0", 1)[0]
        name = prefix + b"/" + name if prefix else name
    return name.decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    """A pax extended header's "LEN key=value\n" records."""
    out, pos = {}, 0
    while pos < len(payload) and payload[pos:pos + 1] != b"\0":
        length = int(payload[pos:payload.index(b" ", pos)])
        key, _, value = payload[payload.index(b" ", pos) + 1:pos + length - 1].partition(b"=")
        out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _tarfile_members(shard: Path) -> list[tuple[str, int, int]]:
    out, size = [], shard.stat().st_size
    try:
        with tarfile.open(shard, "r:") as tf:
            while (info := tf.next()) is not None:
                tf.members = []  # headers only: tarfile would keep every one
                if not info.isfile():
                    continue
                if info.offset_data + info.size > size:
                    raise RecordError(f"{shard}:{info.name}: the shard ends inside this member "
                                      f"(a truncated copy?)")
                out.append((info.name, info.offset_data, info.size))
    except (tarfile.TarError, EOFError) as e:
        raise RecordError(f"{shard}: not a readable tar archive ({e})") from None
    return out


_INTERNED: dict[str, str] = {}


def _intern(ext: str) -> str:
    return _INTERNED.setdefault(ext, ext)


def _text_field(record: dict, ext: str, data: bytes, source: str) -> None:
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise RecordError(f"{source}.{ext}: not UTF-8 text") from None
    if ext in record and record[ext] != text:
        raise RecordError(f"{source}: the record's {ext!r} and the member {ext} differ; keep one")
    record[ext] = text


def _embed(data: bytes, name: str) -> str:
    """The member's bytes in the embedded-media folder, as `<sha256>-<member name>`; an absolute
    path, which the adapters take as it is (`convert` names a relative folder)."""
    return write_once(data, embedded_dir().absolute(), f"-{name}")


def resolve_media(record: dict, key: str, exts: list[str], embed, source: str) -> dict:
    """The record with its media values that name members replaced by `embed(ext)` (a path), and
    the members it does not name filled in by kind (module docstring)."""
    base = key.rpartition("/")[2]
    media = [e for e in exts if e.rpartition(".")[2] in KIND_OF_EXT]
    used: dict[str, str] = {}

    def member(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = value[1:] if value.startswith(".") else value
        for prefix in (f"{key}.", f"{base}."):
            name = name[len(prefix):] if name.startswith(prefix) else name
        if name.lower() in media:
            ext = name.lower()
            used.setdefault(ext, embed(ext))
            return used[ext]
        if name.lower() in KIND_OF_EXT or value.startswith(f"{base}."):
            have = ", ".join(f"{base}.{e}" for e in exts)
            raise RecordError(f"{source}: {value!r} names the member {base}.{name}, which this "
                              f"sample does not hold (it has {have})")
        return value

    named: set[str | None] = set()
    for kind, keys in NAMING_KEYS.items():
        for k in keys:
            value = record.get(k)
            if value in (None, "", []):
                continue
            named.add(kind)
            record[k] = [member(v) for v in value] if isinstance(value, list) else member(value)
    _chat_parts(record, member)
    kinds_used = {KIND_OF_EXT[e.rpartition(".")[2]] for e in used}
    for ext in media:
        kind = KIND_OF_EXT[ext.rpartition(".")[2]]
        if ext in used:
            continue
        if kind in named or kind in kinds_used:
            raise RecordError(f"{source}: the media member {base}.{ext} is named nowhere in the "
                              f"record, which names other {kind}; name it too (e.g. "
                              f"\"{kind}\": [..., \"{ext}\"]) or leave it out of the shard")
        if record.get(kind) in (None, "", []):
            record[kind] = []
        record[kind].append(embed(ext))
    return record


def _chat_parts(record: dict, member) -> None:
    """Media parts of a chat (`{"type": "image", "image": "jpg"}`) naming members."""
    for msg in record.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "video", "audio") and isinstance(part.get(kind), str):
                part[kind] = member(part[kind])
