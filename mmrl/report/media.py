"""Media decoding for the report: images, a few video frames, audio samples.

Decoding here is deliberately independent of mmrl/data/media.py: the report must render a run
dir on a laptop without the training stack, and it wants display-sized frames (not the model's
pixel budget). Decoded media are cached per path because every rollout of a group shares them.
"""
from __future__ import annotations

import functools
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

# Long side of a drawn image in the page. Small synthetic images (56 px) are scaled *up* so that
# 3 px box outlines stay readable; large photos are scaled down to keep the HTML file small.
DISPLAY_SIDE = 320
FRAME_HEIGHT = 90
MAX_AUDIO_SECONDS = 120.0  # longer clips are cut: the picture cannot show more detail anyway


class MediaError(Exception):
    """A media file that exists but could not be decoded (message goes into the page)."""


def resolve(path: str, roots: list[Path]) -> Path | None:
    """The file `path` names, trying it as given and then relative to each root (the run dir,
    the current dir): rollouts.jsonl normally holds absolute paths, but records written from
    relative dataset paths should still render when the report is built next to the data."""
    if not isinstance(path, str) or not path:
        return None
    p = Path(path)
    candidates = [p] if p.is_absolute() else [p] + [r / p for r in roots]
    for c in candidates:
        if c.is_file():
            return c
    return None


@functools.lru_cache(maxsize=64)
def load_image(path: Path) -> Image.Image:
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, OSError, ...)
        raise MediaError(f"could not decode image: {e}") from e


def display_scale(width: int, height: int, side: int = DISPLAY_SIDE) -> float:
    return side / max(width, height, 1)


def _stream_seconds(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base is microseconds
    return None


@functools.lru_cache(maxsize=16)
def video_frames(path: Path, n: int = 6) -> tuple[list[Image.Image], list[float], float | None]:
    """`n` frames at the centres of `n` equal time bins, their times, and the video duration.

    Centred bins make frame i sit exactly above its time on the timeline drawn beneath it.
    """
    import av  # imported lazily: only runs with videos pay for it

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            duration = _stream_seconds(container, stream)
            times = [(i + 0.5) * duration / n for i in range(n)] if duration else []
            frames = _frames_at(container, stream, times) if times else []
            if not frames:  # unknown duration or failed seeks: take the first frames in order
                frames = _first_frames(container, stream, n)
                times = [t for _, t in frames]
            return [im for im, _ in frames], times, duration
    except MediaError:
        raise
    except Exception as e:  # av.error.* and malformed containers
        raise MediaError(f"could not decode video: {e}") from e


@functools.lru_cache(maxsize=64)
def frames_at(path: Path, times: tuple[float, ...]) -> list[Image.Image]:
    """The frames shown at `times` (seconds from the start), display-sized: the frames a
    `frames` tool call returned, redrawn from the file (the run dir keeps only their times)."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            # A frame's recorded time may sit a rounding below its pts: seek a hair earlier.
            found = _frames_at(container, stream, [max(0.0, t - 1e-3) for t in times])
    except Exception as e:  # av.error.* and malformed containers
        raise MediaError(f"could not decode video: {e}") from e
    if len(found) != len(times):
        raise MediaError(f"{len(found)} of {len(times)} frames decoded")
    return [im for im, _ in found]


def _to_image(frame) -> Image.Image:
    im = frame.to_image()
    scale = FRAME_HEIGHT / max(im.height, 1)
    return im.resize((max(1, round(im.width * scale)), FRAME_HEIGHT), Image.BILINEAR)


def _frames_at(container, stream, times: list[float]) -> list[tuple[Image.Image, float]]:
    """Seek to each time and keep the first frame at or after it (keyframe seek, then decode
    forward), so long videos cost n short decodes instead of one full pass."""
    out = []
    tb = stream.time_base or Fraction(1, 1_000_000)
    for t in times:
        container.seek(int(t / tb), stream=stream, backward=True, any_frame=False)
        chosen = None
        for frame in container.decode(stream):
            chosen = frame
            if frame.pts is not None and float(frame.pts * tb) >= t:
                break
        if chosen is not None:
            out.append((_to_image(chosen), t))
    return out


def _first_frames(container, stream, n: int) -> list[tuple[Image.Image, float]]:
    container.seek(0)
    out = []
    for frame in container.decode(stream):
        out.append((_to_image(frame), float(frame.time or 0.0)))
        if len(out) >= n:
            break
    if not out:
        raise MediaError("video has no decodable frames")
    return out


@functools.lru_cache(maxsize=16)
def load_audio(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples and the sample rate. soundfile reads wav/flac/ogg without ffmpeg;
    anything else (mp3, m4a, the audio track of an mp4) goes through PyAV."""
    try:
        import soundfile as sf

        data, sr = sf.read(str(path), dtype="float32", always_2d=True,
                           frames=-1)
        samples = data.mean(axis=1)
    except Exception:
        samples, sr = _audio_via_av(path)
    samples = samples[: int(MAX_AUDIO_SECONDS * sr)]
    if samples.size == 0:
        raise MediaError("audio has no samples")
    return samples.astype(np.float32), int(sr)


def _audio_via_av(path: Path) -> tuple[np.ndarray, int]:
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.audio[0]
            sr = stream.rate or stream.codec_context.sample_rate
            chunks = []
            for frame in container.decode(stream):
                arr = frame.to_ndarray().astype(np.float32)
                # Planar frames are [channels, n]; packed ones are [1, n * channels].
                chunks.append(arr.mean(axis=0) if frame.format.is_planar else
                              arr.reshape(-1, len(frame.layout.channels)).mean(axis=1))
                if sum(c.size for c in chunks) > MAX_AUDIO_SECONDS * sr:
                    break
        if not chunks:
            raise MediaError("audio has no decodable frames")
        samples = np.concatenate(chunks)
        if np.abs(samples).max(initial=0) > 1.5:  # integer sample formats: scale to [-1, 1]
            samples = samples / max(np.abs(samples).max(), 1.0)
        return samples, int(sr)
    except MediaError:
        raise
    except Exception as e:
        raise MediaError(f"could not decode audio: {e}") from e
