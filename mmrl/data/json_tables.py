"""JSONL files and JSON lists read by byte offset: opening one scans it once (checking that every
record is valid UTF-8 JSON, naming file:line when not) and keeps only where each record starts
and how long it is, 12 bytes a record; a record is read and parsed when it is indexed. Held whole
as Python dicts, records cost about 3 KB each on every rank (100k records added 295 MB to a
3-step run; docs/data.md has the table).
"""
from __future__ import annotations

import bisect
import codecs
import json
import os
import re
from array import array
from collections.abc import Sequence
from pathlib import Path

from mmrl.data.media_errors import RecordError

_CHUNK = 1 << 22  # bytes read at a time while scanning a JSON list
_SPACE = re.compile(r"[ \t\n\r]*")


def utf8(data: bytes, path: Path, lineno: int | None = None) -> str:
    """`data` decoded; a RecordError naming the line and column of a byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1)
        if lineno is None:  # a whole file: find the line of the bad byte
            lineno = data.count(b"\n", 0, e.start) + 1
        raise RecordError(f"{path}:{lineno}: not UTF-8 text (byte 0x{data[e.start]:02x} at "
                          f"column {column + 1}); re-encode the file as UTF-8, e.g. "
                          f"`iconv -f latin1 -t utf-8`") from None


class Rows(Sequence):
    """Indexing of a table: slices, negative indices and bounds; `_row(i)` reads row i."""

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._row(i % len(self))

    def _row(self, i: int):
        raise NotImplementedError


class _OffsetTable(Rows):
    """Records at (offset, length) in one file; sources are "file:line" or "file[i]"."""

    columns = None  # records may differ in their keys
    blocks = None

    def __init__(self, path: Path):
        self.path = path
        self.offsets, self.lengths = array("q"), array("I")
        self._file, self._pid = None, None

    def __len__(self) -> int:
        return len(self.offsets)

    def _read(self, i: int) -> bytes:
        if self._file is None or self._pid != os.getpid():  # a forked worker opens its own
            self._file, self._pid = open(self.path, "rb"), os.getpid()
        self._file.seek(self.offsets[i])
        return self._file.read(self.lengths[i])

    def _row(self, i: int) -> tuple[dict, str]:
        return json.loads(self._read(i)), self.source(i)

    def source(self, i: int) -> str:
        raise NotImplementedError

    def __getstate__(self):  # picklable (a DataLoader worker, a spawned process): no file handle
        return {**self.__dict__, "_file": None, "_pid": None}


class JsonlTable(_OffsetTable):
    """One JSON object per line; blank lines are skipped, and sources keep the file's line
    numbers. A line that is not UTF-8 JSON raises, or with `bad_lines` (a list: `data inspect`
    counts them all) is described there and left out."""

    def __init__(self, path: Path, bad_lines: list[str] | None = None):
        super().__init__(path)
        self.lines = array("I")
        offset = 0
        with open(path, "rb") as f:  # bytes: a bad byte is reported with its line number
            for lineno, raw in enumerate(f, 1):
                try:
                    is_record = self._parses(raw, lineno)
                except RecordError as e:
                    if bad_lines is None:
                        raise
                    bad_lines.append(str(e))
                    is_record = False
                if is_record:
                    self.offsets.append(offset)
                    self.lengths.append(len(raw))
                    self.lines.append(lineno)
                offset += len(raw)

    def _parses(self, raw: bytes, lineno: int) -> bool:
        """True for a line of JSON, False for a blank one, else a RecordError naming it."""
        text = utf8(raw, self.path, lineno)
        if not text.strip():
            return False
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise RecordError(f"{self.path}:{lineno}: not valid JSON ({e.msg})") from None
        return True

    def source(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}"


class JsonListTable(_OffsetTable):
    """A JSON list of records, scanned in chunks of _CHUNK bytes: memory is one chunk and the
    offsets, whatever the file's size."""

    def __init__(self, path: Path):
        super().__init__(path)
        decoder, text_of = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")()
        with open(path, "rb") as f:
            buf, pos, byte_pos, eof = "", 0, 0, False

            def more() -> bool:  # append a chunk to buf (dropping what was read); False at EOF
                nonlocal buf, pos, eof
                data = f.read(_CHUNK)
                eof = not data
                try:
                    buf = buf[pos:] + text_of.decode(data, final=eof)
                except UnicodeDecodeError:
                    utf8(path.read_bytes(), path)  # names the line; raises
                pos = 0
                return not eof

            def skip_space() -> str:  # the next non-space character, reading on as needed
                nonlocal pos, byte_pos
                while True:
                    end = _SPACE.match(buf, pos).end()
                    byte_pos, pos = byte_pos + end - pos, end
                    if pos < len(buf) or not more():
                        return buf[pos:pos + 1]

            if skip_space() != "[":
                raise RecordError(f"{path}: expected a JSON list of records")
            pos, byte_pos = pos + 1, byte_pos + 1
            while True:
                first = skip_space()
                if first == "]" and not self.offsets:
                    break
                obj_end = self._scan_one(decoder, lambda: buf, lambda: pos, more,
                                         lambda: eof, len(self.offsets))
                size = obj_end - pos if buf.isascii() else len(buf[pos:obj_end].encode())
                self.offsets.append(byte_pos)
                self.lengths.append(size)
                byte_pos, pos = byte_pos + size, obj_end
                sep = skip_space()
                if sep == "]":
                    break
                if sep != ",":
                    raise RecordError(f"{path}[{len(self.offsets) - 1}]: expected ',' or ']' "
                                      f"after the record, found {sep or 'the end of the file'!r}")
                pos, byte_pos = pos + 1, byte_pos + 1

    def _scan_one(self, decoder, buf, pos, more, eof, index: int) -> int:
        """The end (in buf) of the JSON value at pos, reading more of the file until it is whole
        (a value cut by a chunk end does not parse, or parses short if it is a number)."""
        while True:
            try:
                _, end = decoder.raw_decode(buf(), pos())
                if end < len(buf()) or eof():
                    return end
            except json.JSONDecodeError as e:
                if eof():
                    raise RecordError(f"{self.path}[{index}]: not valid JSON ({e.msg})") from None
            more()

    def source(self, i: int) -> str:
        return f"{self.path}[{i}]"


class ConcatTable(Rows):
    """Several tables read as one (the files of one split)."""

    columns = None
    blocks = None

    def __init__(self, tables: list[Sequence]):
        self.tables, self._starts = tables, [0]
        for t in tables:
            self._starts.append(self._starts[-1] + len(t))

    def __len__(self) -> int:
        return self._starts[-1]

    def _row(self, i: int) -> tuple[dict, str]:
        t = bisect.bisect_right(self._starts, i) - 1
        return self.tables[t][i - self._starts[t]]
