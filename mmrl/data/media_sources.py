"""A media item as a record holds it -> a local file the loaders (media.py, audio.py) decode.

Accepted in every schema (docs/data.md "Media in a record"):

    "a.png", "/abs/a.png"          a path (relative to the data file)
    "file:///abs/a.png"            a file URL
    "data:image/png;base64,..."    a data URI (base64 or percent-encoded)
    "iVBORw0KGgo..."               raw base64 (ms-swift), recognised by what it decodes to
    {"bytes": b"...", "path": "a.png"}, {"path": "a.png"}   HF `datasets` Image/Audio columns
    {"array": [...], "sampling_rate": 16000}                 a decoded HF Audio column
    a PIL image, bytes                                       `datasets` rows as Python objects
    "https://host/a.png"           fetched once into the embedded folder, unless fetching is off
                                   (HF_HUB_OFFLINE=1 or MMRL_FETCH_MEDIA=0)

Bytes are written once to a content-addressed folder ($MMRL_EMBEDDED_DIR, default
~/.cache/mmrl/embedded; `convert` points it next to its output with `embedding_into`) under the
suffix their first bytes say (an audio item is never written as `.png`); decoding then goes
through the loaders' guards (an image's header size is checked before it is decoded). A bad item
(base64 that does not decode, a URL that cannot be fetched) is a MediaError naming file:line and
the key, so `data.on_bad_sample: skip` covers it.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import re
import urllib.parse
import urllib.request
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator

from mmrl.data.media_errors import MediaError, RecordError

_EMBED_INTO: ContextVar[Path | None] = ContextVar("mmrl_embedded_dir", default=None)
FETCH_ENV = "MMRL_FETCH_MEDIA"  # "0" turns fetching of http(s) media off
OFF_WORDS = {"0", "false", "no", "off"}
FETCH_TIMEOUT_S = 60
MAX_FETCH_BYTES = 1 << 30  # a URL answering more than 1 GiB is refused, not written
MIN_BASE64 = 64  # shorter strings are paths: no image or sound file fits in 48 bytes
BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}\s*")
NAME_MAX = 255  # the longest file name a file system takes (Errno 36 past it)
# (offset, magic bytes, suffix): what a file's first bytes say it is.
SIGNATURES = [(0, b"\x89PNG\r\n\x1a\n", ".png"), (0, b"\xff\xd8\xff", ".jpg"), (0, b"GIF8", ".gif"),
              (8, b"WEBP", ".webp"), (8, b"WAVE", ".wav"), (8, b"AVI ", ".avi"), (0, b"BM", ".bmp"),
              (0, b"fLaC", ".flac"), (0, b"OggS", ".ogg"), (0, b"ID3", ".mp3"),
              (0, b"\xff\xfb", ".mp3"), (0, b"\xff\xf3", ".mp3"), (0, b"\xff\xf2", ".mp3"),
              (0, b"\xff\xf1", ".aac"), (0, b"\xff\xf9", ".aac"), (0, b"\x1aE\xdf\xa3", ".webm"),
              (4, b"ftyp", ".mp4")]


def kind_of(key: str) -> str:
    """"image", "video" or "audio" for a record key ("audios", "audio_path", "full_videos")."""
    return next((k for k in ("audio", "video") if k in key), "image")


def sniff(data: bytes, kind: str) -> str | None:
    """The suffix the bytes' signature says, or None when they match no known media file."""
    for offset, magic, suffix in SIGNATURES:
        if data[offset:offset + len(magic)] == magic:
            return ".m4a" if suffix == ".mp4" and kind == "audio" else suffix
    return None


def embedded_dir() -> Path:
    """Where embedded and fetched media are written: `embedding_into`'s folder, else
    $MMRL_EMBEDDED_DIR, else ~/.cache/mmrl/embedded."""
    into = _EMBED_INTO.get()
    if into is not None:
        return into
    return Path(os.environ.get("MMRL_EMBEDDED_DIR") or Path.home() / ".cache" / "mmrl" / "embedded")


@contextlib.contextmanager
def embedding_into(folder: str | Path) -> Iterator[Path]:
    """Write embedded media under `folder` inside the block (this thread/context only)."""
    token = _EMBED_INTO.set(Path(folder))
    try:
        yield Path(folder)
    finally:
        _EMBED_INTO.reset(token)


def embed(data: bytes, kind: str, name_hint: str = "") -> str:
    """Write `data` once (content-addressed) and return its path; the suffix is what the bytes
    say, else the hint's, else `.bin` (the loaders then read the content, not the name)."""
    suffix = sniff(data, kind) or Path(name_hint).suffix.lower() or ".bin"
    return write_once(data, embedded_dir(), suffix)


def write_once(data: bytes, folder: Path, tail: str) -> str:
    """`data` at `folder/<sha256 prefix><tail>`, written once and atomically (ranks and
    workers may race on the same bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}{tail}"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return str(path)


def _bad(source: str, key: str, what: str) -> MediaError:
    return MediaError(f"{source}: {key!r}: {what}")


def resolve(value: Any, base: Path, source: str, key: str) -> str:
    """The local path of one media item in any accepted form (module docstring)."""
    kind = kind_of(key)
    if isinstance(value, str):
        return _from_string(value.strip(), base, source, key, kind)
    if isinstance(value, dict):
        if value.get("bytes"):
            return embed(bytes(value["bytes"]), kind, str(value.get("path") or ""))
        if value.get("array") is not None and value.get("sampling_rate"):
            return _audio_array(value["array"], value["sampling_rate"], source, key)
        for field in ("path", "url", kind):  # {"path"}, {"url"} (OpenAI), {"image": ...}
            if isinstance(value.get(field), str) and value[field].strip():
                return _from_string(value[field].strip(), base, source, key, kind)
    if isinstance(value, (bytes, bytearray)):
        return embed(bytes(value), kind)
    if hasattr(value, "save") and hasattr(value, "size"):  # a PIL image from `datasets`
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return embed(buf.getvalue(), "image")
    raise RecordError(f"{source}: {key!r}: expected a path, URL, data: URI, base64, "
                      f"{{'bytes'|'path'}} or an image, got {value!r:.80}")


def _from_string(text: str, base: Path, source: str, key: str, kind: str) -> str:
    if not text:
        raise RecordError(f"{source}: {key!r}: an empty media path")
    scheme = text.split(":", 1)[0].lower() if ":" in text[:12] else ""
    if scheme in SCHEMES:
        return SCHEMES[scheme](text, source, key, kind)
    if len(text) >= MIN_BASE64 and BASE64.fullmatch(text):
        data = _b64(text, source, key, strict=False)
        if data is not None and sniff(data, kind):
            return embed(data, kind)
    if any(len(part.encode()) > NAME_MAX for part in Path(text).parts):
        raise _bad(source, key, f"{text[:40]}... ({len(text)} characters) is not a path (a name "
                                f"over {NAME_MAX} bytes), nor a data: URI, URL or base64 of a "
                                f"known media file")
    return text if Path(text).is_absolute() else str(base / text)


def _file_url(text: str, source: str, key: str, kind: str) -> str:
    return urllib.request.url2pathname(urllib.parse.urlparse(text).path)


def _data(text: str, source: str, key: str, kind: str) -> str:
    return embed(_data_uri(text, source, key), kind)


def _b64(text: str, source: str, key: str, strict: bool = True) -> bytes | None:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        if not strict:
            return None
        raise _bad(source, key, f"base64 that does not decode ({e})") from None


def _data_uri(text: str, source: str, key: str) -> bytes:
    head, sep, payload = text.partition(",")
    if not sep:
        raise _bad(source, key, f"a data: URI without a ',' before its data ({text[:40]}...)")
    if head.lower().endswith(";base64"):
        return _b64(payload, source, key)
    return urllib.parse.unquote_to_bytes(payload)


def fetching_off() -> str | None:
    """Why http(s) media may not be fetched now (the setting that says so), or None."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", *OFF_WORDS):
        return "HF_HUB_OFFLINE is set"
    if os.environ.get(FETCH_ENV, "").strip().lower() in OFF_WORDS:
        return f"{FETCH_ENV}={os.environ[FETCH_ENV]}"
    return None


def fetch(url: str, source: str, key: str, kind: str) -> str:
    """A URL's file in the embedded folder, keyed by the URL: fetched once, reused offline."""
    name = hashlib.sha256(url.encode()).hexdigest()[:32]
    folder = embedded_dir() / "fetched"
    done = next(iter(sorted(folder.glob(f"{name}.*"))), None) if folder.is_dir() else None
    if done is not None:
        return str(done)
    off = fetching_off()
    if off:
        raise _bad(source, key, f"{url} is a URL and fetching is off ({off}): download it and "
                                f"give the path, or unset HF_HUB_OFFLINE and {FETCH_ENV} to "
                                f"fetch it into {folder}")
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_FETCH_BYTES + 1)
    except (OSError, ValueError) as e:  # URLError, HTTPError, timeouts, bad URLs
        raise _bad(source, key, f"cannot fetch {url}: {e}") from None
    if len(data) > MAX_FETCH_BYTES:
        raise _bad(source, key, f"{url} is over {MAX_FETCH_BYTES >> 20} MiB: download it first")
    if not data:
        raise _bad(source, key, f"{url} answered with no data")
    suffix = sniff(data, kind) or Path(urllib.parse.urlparse(url).path).suffix.lower() or ".bin"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}{suffix}"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return str(path)


def _audio_array(array: Any, rate: Any, source: str, key: str) -> str:
    """A decoded HF Audio column ({"array", "sampling_rate"}) written once as a .wav."""
    import numpy as np
    import soundfile as sf

    try:
        wave = np.asarray(array, dtype=np.float32)
        rate = int(rate)
    except (TypeError, ValueError) as e:
        raise _bad(source, key, f"an audio array that is not numbers ({e})") from None
    if wave.ndim not in (1, 2) or wave.size == 0 or rate <= 0:
        raise _bad(source, key, f"an audio array of shape {wave.shape} at {rate} Hz: expected "
                                f"samples (or samples x channels) at a positive rate")
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format="WAV", subtype="FLOAT")
    return embed(buf.getvalue(), "audio")


# A media string's URL scheme -> how its item becomes a local file.
SCHEMES = {"data": _data, "file": _file_url, "http": fetch, "https": fetch}
