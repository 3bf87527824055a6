"""Decode audio: a mono float32 waveform at 16 kHz from any file (mmrl.data.media re-exports it).

Reads wav/flac/ogg with soundfile and everything else with PyAV (mp3, m4a, a video's track:
qwen-omni-utils needs the ffmpeg program there), resampled with soxr as librosa does in
qwen-omni-utils; on CPU there is no torchaudio/torchcodec (docs/install-notes.md). Bad audio
raises MediaError naming the record and the file.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from mmrl.data.media_errors import check_file as _check_file, fail as _fail
from mmrl.types import AUDIO_SAMPLING_RATE

# Shorter audio is a MediaError: Qwen2-Audio's forward raises a TypeError on 60 ms or less
# (960 samples at 16 kHz; transformers 5.19), after the run has started; 0.1 s is the round
# bound above it, and no task can hear anything in less.
MIN_SECONDS = 0.1
RESAMPLE_MARGIN = 0.1  # s read past a head cut, so the resampler's filter sees what follows it
SOUNDFILE_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif"}


class AudioCache(Protocol):
    """What load_audio needs of a cache (mmrl.data.cache.MediaCache is one)."""

    def audio(self, path: str, params: dict,
              decode: Callable[[], tuple[np.ndarray, bool]]) -> tuple[np.ndarray, bool]: ...


# Per `truncate` (data.audio_truncate), whether audio over max_seconds keeps its start (else raises).
AUDIO_KEEPS_HEAD = {"error": False, "head": True}


def load_audio(path: str, *, sr: int = AUDIO_SAMPLING_RATE, max_seconds: float | None = None,
               truncate: str = "error", source: str = "", cache: AudioCache | None = None,
               stats: dict | None = None) -> np.ndarray:
    """Mono float32 waveform at `sr` Hz (channels averaged, resampled with soxr).

    Duration policy when `max_seconds` is set: truncate="error" raises MediaError for longer audio;
    truncate="head" keeps the first max_seconds and counts it in `stats["audio_truncated"]` (pass
    a dict to collect the count). Reads wav/flac/ogg with soundfile, anything else with PyAV
    (mp3, m4a, the audio track of a video).
    """
    if truncate not in AUDIO_KEEPS_HEAD:
        raise ValueError(f"load_audio: truncate must be 'error' or 'head', got {truncate!r}")
    if sr <= 0 or (max_seconds is not None and not max_seconds > 0):
        raise ValueError(f"load_audio: need sr > 0 and max_seconds > 0 (got {sr}, {max_seconds})")
    _check_file(path, "audio", source)
    params = {"sr": int(sr), "max_seconds": max_seconds, "truncate": truncate}

    def decode() -> tuple[np.ndarray, bool]:
        return _decode_audio(path, int(sr), max_seconds, AUDIO_KEEPS_HEAD[truncate], source)

    audio, truncated = decode() if cache is None else cache.audio(path, params, decode)
    if truncated and stats is not None:
        stats["audio_truncated"] = stats.get("audio_truncated", 0) + 1
    return audio


def _decode_audio(path: str, sr: int, max_seconds: float | None, keep_head: bool,
                  source: str) -> tuple[np.ndarray, bool]:
    limit = None if max_seconds is None else max_seconds  # seconds
    x = native = None
    errors = []
    if Path(path).suffix.lower() in SOUNDFILE_SUFFIXES:
        try:
            x, native = _read_soundfile(path, limit, keep_head)
        except _TooLong as e:
            raise _fail(source, "audio", path, str(e)) from None
        except Exception as e:  # soundfile.LibsndfileError, RuntimeError: try FFmpeg instead
            errors.append(f"soundfile: {e}")
    if x is None:
        try:
            x, native = _read_pyav(path, limit, keep_head)
        except _TooLong as e:
            raise _fail(source, "audio", path, str(e)) from None
        except _NoAudio:
            raise _fail(source, "audio", path, "the file has no audio track") from None
        except Exception as e:
            errors.append(f"pyav: {str(e).strip()[:300]}")
            raise _fail(source, "cannot decode audio", path, "; ".join(errors)) from None
    if x.size == 0:
        raise _fail(source, "audio", path, "no audio samples (zero-length audio)")
    if x.shape[0] < MIN_SECONDS * native:
        raise _fail(source, "audio", path, too_short(x.shape[0] / native))
    truncated = limit is not None and x.shape[0] > limit * native
    if native != sr:
        import soxr

        x = soxr.resample(x, native, sr)
    if limit is not None:  # without keep_head this only drops resampling round-off
        x = x[:int(round(limit * sr))]
    return np.ascontiguousarray(x, dtype=np.float32), bool(truncated)


def too_short(seconds: float) -> str:
    return (f"{seconds * 1000:.0f} ms of audio is shorter than the {MIN_SECONDS * 1000:.0f} ms "
            f"the audio models take (Qwen2-Audio fails on 60 ms or less): drop or lengthen it")


class _TooLong(Exception):
    pass


class _NoAudio(Exception):
    pass


def _too_long(seconds: float, limit: float) -> _TooLong:
    return _TooLong(f"audio is {seconds:.2f} s, longer than max_seconds={limit:g} "
                    f"(set truncate='head' to keep the first {limit:g} s)")


def _read_soundfile(path: str, limit: float | None, keep_head: bool) -> tuple[np.ndarray, int]:
    import soundfile as sf

    info = sf.info(path)
    frames = -1
    if limit is not None and info.frames > limit * info.samplerate:
        if not keep_head:
            raise _too_long(info.frames / info.samplerate, limit)
        frames = int(math.ceil((limit + RESAMPLE_MARGIN) * info.samplerate))
    x, native = sf.read(path, frames=frames, dtype="float32", always_2d=True)
    return x.mean(axis=1), int(native)


def _read_pyav(path: str, limit: float | None, keep_head: bool) -> tuple[np.ndarray, int]:
    import av

    chunks, total = [], 0
    with av.open(path) as container:
        if not container.streams.audio:
            raise _NoAudio()
        stream = container.streams.audio[0]
        native = int(stream.sample_rate or stream.codec_context.sample_rate)
        resampler = None
        for frame in container.decode(stream):
            if resampler is None:  # planar float, native rate and layout: we average channels
                resampler = av.AudioResampler(format="fltp", layout=frame.layout.name,
                                              rate=frame.sample_rate)
            for out in resampler.resample(frame):
                arr = out.to_ndarray()  # [channels, n]
                chunks.append(arr.mean(axis=0))
                total += arr.shape[1]
            if limit is not None and total > limit * native:
                if not keep_head:
                    raise _too_long(total / native, limit)  # at least this long
                if total > (limit + RESAMPLE_MARGIN) * native:
                    break
        if resampler is not None:
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().mean(axis=0))
    x = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return x, native
