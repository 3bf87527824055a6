"""Decode the media a Sample references: images (PIL), video frames (numpy), audio (numpy).

Bad media (missing, empty, corrupt, unsupported codec, no audio track where audio is asked for, a
segment outside the video) raises `MediaError` whose message names the record (`sample.source`,
"file:line") and the file. The caller applies `data.on_bad_sample` (error, or a counted skip);
nothing substitutes a fallback sample silently.

The Qwen rules come from qwen-vl-utils, as in the anchors' and users' scripts: image sizes
(`smart_resize`, `fetch_image`), the frames a video shows and their rate (`smart_nframes`,
`calculate_video_frame_range`). Decoding stays here: on CPU there is no torchaudio/torchcodec
(their wheels are CUDA-linked, docs/install-notes.md) and torchvision has no video reader, so
the library's readers would fail. Video: decord with PyAV as the fallback. Audio: mmrl.data.audio
(re-exported here as `load_audio`).
"""
from __future__ import annotations

import math
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmrl.data.audio import load_audio
from mmrl.data.media_errors import MediaError, check_file as _check_file, fail as _fail
from mmrl.data.video_plan import (DEFAULT_FPS, TEMPORAL_PATCH, DecodeCache, Video,  # noqa: F401
                                  PlanError, plan_frames)
from mmrl.types import Sample
from rewards.boxes import smart_resize

PIXEL_FACTOR = 28  # Qwen-VL: 14 px patches merged 2x2 -> sides are multiples of 28
VIDEO_BACKENDS = ("auto", "decord", "pyav")
# Sample.fields keys that override video decoding per record -> load_video keyword.
VIDEO_FIELD_OVERRIDES = {"video_start": "start", "video_end": "end", "fps": "fps",
                         "nframes": "nframes", "max_frames": "max_frames",
                         "frame_fps": "frame_fps"}
FRAME_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


@contextmanager
def processor_errors(sample: Sample):
    """Inside: the processor's rejections of a sample's media (an aspect ratio over 200, an image
    under the patch size, too many frames or tokens: ValueErrors in transformers) become a
    MediaError naming the record, so `data.on_bad_sample=skip` covers them too."""
    try:
        yield
    except ValueError as e:
        media = ", ".join([*sample.images, *sample.videos, *sample.audios]) or "no media"
        raise MediaError(f"{sample.source}: the processor rejected the sample ({media}): "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


# ------------------------------------------------------------------------------------ images ----

# Decoding is refused above max(DECODE_FACTOR x the pixel budget, DECODE_FLOOR) pixels: a
# 12000x12000 PNG of 445 KB decoded to 6.8 GB of RSS before the budget shrank it. JPEGs first
# decode reduced (Pillow's draft: 1/2 .. 1/8 scale in the DCT), so only other formats meet it.
DECODE_FACTOR, DECODE_FLOOR = 4, 16_000_000


def decode_limit(max_pixels: int | None) -> int:
    """The most pixels an image may have when decoded, under data.image_max_pixels."""
    return max(DECODE_FACTOR * image_budget(None, max_pixels)[1], DECODE_FLOOR)


def image_too_big(im: Image.Image, max_pixels: int | None) -> str | None:
    """Before decoding (`Image.open` read only the header): sets a JPEG to decode at the
    smallest scale that still covers the budget; -> why the image is still too big to decode
    (over `decode_limit`), or None."""
    budget = image_budget(None, max_pixels)[1]
    w, h = im.size
    if im.format == "JPEG" and w * h > budget:
        scale = math.sqrt(budget / (w * h))
        im.draft("RGB", (math.ceil(w * scale), math.ceil(h * scale)))
        w, h = im.size
    limit = decode_limit(max_pixels)
    if w * h <= limit:
        return None
    return (f"{w}x{h} is {w * h / 1e6:.0f} MP, over the {limit / 1e6:.0f} MP a run decodes "
            f"(max({DECODE_FACTOR} x data.image_max_pixels, {DECODE_FLOOR // 10**6} MP)): "
            f"downscale the file, or raise data.image_max_pixels")


def _open_quietly(path: str) -> Image.Image:
    """Image.open without Pillow's warning over 89 MP: image_too_big decides, in one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(path)


def load_image(path: str, source: str = "", max_pixels: int | None = None) -> Image.Image:
    """Open an image as RGB with its EXIF orientation applied (phone photos are stored rotated),
    decoding no more pixels than the budget `max_pixels` (data.image_max_pixels) needs."""
    _check_file(path, "image", source)
    try:
        with _open_quietly(path) as im:
            too_big = image_too_big(im, max_pixels)
            if too_big:
                raise _fail(source, "image", path, too_big)
            im = ImageOps.exif_transpose(im)
            if im.mode in ("RGBA", "LA", "P"):  # composite transparency on white, not black
                im = im.convert("RGBA")
                bg = Image.new("RGB", im.size, (255, 255, 255))
                bg.paste(im, mask=im.getchannel("A"))
                return bg
            return im.convert("RGB")
    except Image.DecompressionBombError as e:  # over Pillow's limit: neither OSError nor Value
        raise _fail(source, "image", path, f"{e} Downscale the file") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise _fail(source, "cannot decode image", path, str(e)) from None


def fit_pixels(w: int, h: int, min_pixels: int, max_pixels: int,
               factor: int = PIXEL_FACTOR) -> tuple[int, int]:
    """(w', h'): sides rounded to multiples of `factor`, area brought within [min, max] pixels
    keeping the aspect ratio (Qwen-VL `smart_resize` semantics). Never below one factor x factor.

    >>> fit_pixels(640, 480, 28 * 28, 1024 * 28 * 28)
    (644, 476)
    >>> fit_pixels(640, 480, 28 * 28, 64 * 28 * 28)
    (252, 168)
    """
    if w <= 0 or h <= 0:
        raise ValueError(f"fit_pixels: sides must be positive, got {w}x{h}")
    if min_pixels > max_pixels:
        raise ValueError(f"fit_pixels: min_pixels {min_pixels} > max_pixels {max_pixels}")
    if max(w, h) / min(w, h) > 200:
        raise ValueError(f"fit_pixels: aspect ratio of {w}x{h} is over 200 (Qwen-VL rejects it)")
    # The rule is qwen-vl-utils' smart_resize, reached through `rewards.boxes.smart_resize` (which
    # maps boxes into the model's input frame with it): one rule for images, frames and boxes.
    hb, wb = smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return wb, hb


def image_budget(min_pixels: int | None, max_pixels: int | None) -> tuple[int, int]:
    """data.image_min/max_pixels with None filled by Qwen's defaults (4 .. 16384 patches of 28,
    qwen-vl-utils' and the Qwen2/2.5-VL processors'), shared by `fit_image` and the box rewards."""
    from rewards.boxes import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS

    return (QWEN_MIN_PIXELS if min_pixels is None else int(min_pixels),
            QWEN_MAX_PIXELS if max_pixels is None else int(max_pixels))


def add_resized_sizes(samples: list[Sample], min_pixels: int | None,
                      max_pixels: int | None, factor: int = PIXEL_FACTOR) -> None:
    """Store `resized_size` = [w, h] (the frame `fit_image` gives the processor under
    data.image_min/max_pixels) on single-image samples with an `image_size`, so that box rewards
    with coords=qwen2_5_vl map boxes through the same budget (qwen-vl-utils' smart_resize, via
    fit_pixels, is the one rule for both)."""
    if min_pixels is None and max_pixels is None:
        return  # the processor's defaults are the rewards' defaults (Qwen's)
    lo, hi = image_budget(min_pixels, max_pixels)
    for s in samples:
        size = s.fields.get("image_size")
        if len(s.images) == 1 and isinstance(size, (list, tuple)) and len(size) == 2:
            try:
                s.fields["resized_size"] = list(fit_pixels(int(size[0]), int(size[1]), lo, hi,
                                                           factor))
            except (TypeError, ValueError):
                continue  # an unusable size: the reward scores None and inspect says so


def enlarge(box: list[float], side: float, width: int, height: int) -> list[int]:
    """Integer pixel box grown about its centre to at least `side` per axis (never past the
    image; an image smaller than `side` gives its whole extent), as DeepEyes and verl do: a
    region under one merged patch holds too little to look at."""
    out = []
    for lo, hi, limit in ((box[0], box[2], width), (box[1], box[3], height)):
        lo, hi = math.floor(lo), math.ceil(hi)
        need = min(side, limit) - (hi - lo)
        if need > 0:
            lo -= need // 2
            hi += need - need // 2
            shift = max(0, -lo) - max(0, hi - limit)
            lo, hi = lo + shift, hi + shift
        out.append((max(0, lo), min(limit, hi)))
    (x1, x2), (y1, y2) = out
    return [x1, y1, x2, y2]


def fit_image(image: Image.Image, min_pixels: int | None, max_pixels: int | None,
              source: str = "", path: str = "", factor: int = PIXEL_FACTOR) -> Image.Image:
    """The image resized by qwen-vl-utils' `fetch_image` to its smart_resize frame under
    `image_budget(min_pixels, max_pixels)`, as the anchors do before the processor: the
    processor then keeps the frame, and `resized_size` (box rewards) is that frame. A size the
    rule rejects is a MediaError naming the record."""
    from qwen_vl_utils import fetch_image

    lo, hi = image_budget(min_pixels, max_pixels)
    try:
        return fetch_image({"image": image, "min_pixels": lo, "max_pixels": hi},
                           image_patch_size=factor // 2)
    except (ValueError, AssertionError) as e:  # aspect ratio over 200, min > max, a 0 side
        raise _fail(source, "image", path, f"cannot be resized for the model ({e})") from None


# ------------------------------------------------------------------------------------- video ----

_decord: Any = None


def _import_decord():
    global _decord
    if _decord is None:
        try:
            import decord

            _decord = decord
        except ImportError:
            _decord = False
    return _decord or None


def _decode_decord(path: str, plan: Callable[[int, float], tuple[list[int], float]]):
    decord = _import_decord()
    if decord is None:
        raise ImportError("decord is not installed (pip install decord==0.6.0)")
    vr = decord.VideoReader(path, ctx=decord.cpu(0))
    native = float(vr.get_avg_fps())
    idx, sample_fps = plan(len(vr), native)
    frames = vr.get_batch(idx).asnumpy()
    return frames, idx, sample_fps, len(vr), native


def _decode_pyav(path: str, plan: Callable[[int, float], tuple[list[int], float]]):
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise MediaError("no video stream")
        stream = container.streams.video[0]
        native = float(stream.average_rate or stream.guessed_rate or 0)
        n = stream.frames or sum(1 for p in container.demux(stream) if p.size)
    idx, sample_fps = plan(n, native)
    frames = _pyav_frames(path, idx)
    if len(frames) < len(set(idx)):  # the header overstated the frame count: plan on the truth
        with av.open(path) as container:
            n = sum(1 for _ in container.decode(video=0))
        idx, sample_fps = plan(n, native)
        frames = _pyav_frames(path, idx)
    return np.stack([frames[i] for i in idx]), idx, sample_fps, n, native


def _pyav_frames(path: str, idx: list[int]) -> dict[int, np.ndarray]:
    import av

    wanted, last, out = set(idx), max(idx), {}
    with av.open(path) as container:
        container.streams.video[0].thread_type = "AUTO"
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    return out


def _resize_frames(frames: np.ndarray, max_total_pixels: int) -> np.ndarray:
    t, h, w = frames.shape[:3]
    per_frame = max(PIXEL_FACTOR * PIXEL_FACTOR, max_total_pixels // t)
    nw, nh = fit_pixels(w, h, PIXEL_FACTOR * PIXEL_FACTOR, per_frame)
    if (nw, nh) == (w, h):
        return frames
    return np.stack([np.asarray(Image.fromarray(f).resize((nw, nh), Image.BICUBIC)) for f in frames])


def load_video(path: str, *, fps: float | None = None, nframes: int | None = None,
               start: float | None = None, end: float | None = None, max_frames: int = 64,
               max_total_pixels: int | None = None, backend: str = "auto", source: str = "",
               cache: "DecodeCache | None" = None, frame_fps: float | None = None) -> Video:
    """Sample frames from a video file, or a frame folder (`frame_folder`), by `plan_frames`.

    fps XOR nframes (neither: fps=2). `start`/`end` (seconds) restrict sampling to a segment.
    `max_total_pixels` bounds T*H*W over all frames: frames are resized to multiples of 28 within
    max_total_pixels / T each (never below 28x28). backend "auto" = decord, then PyAV if decord is
    missing or fails. `source` ("file:line") prefixes error messages. `cache` reuses earlier decodes.
    """
    if fps is not None and nframes is not None:
        raise ValueError("load_video: give fps or nframes, not both")
    if fps is not None and not fps > 0:
        raise ValueError(f"load_video: fps must be > 0, got {fps}")
    if nframes is not None and (int(nframes) != nframes or nframes < 1):
        raise ValueError(f"load_video: nframes must be a positive integer, got {nframes}")
    if max_frames < TEMPORAL_PATCH:
        raise ValueError(f"load_video: max_frames must be >= {TEMPORAL_PATCH}, got {max_frames}")
    if backend not in VIDEO_BACKENDS:
        raise ValueError(f"load_video: backend must be one of {VIDEO_BACKENDS}, got {backend!r}")
    if fps is None and nframes is None:
        fps = DEFAULT_FPS
    params = {"fps": fps, "nframes": nframes, "start": start, "end": end, "max_frames": max_frames,
              "max_total_pixels": max_total_pixels}
    if Path(path).is_dir():
        files, native = frame_folder(path, frame_fps, source)
        params["frame_fps"] = native

        def decode() -> Video:
            return _decode_frames(path, files, native, params, source)
    else:
        _check_file(path, "video", source)

        def decode() -> Video:
            return _decode_video(path, params, backend, source)

    if cache is None:
        return decode()
    return cache.video(path, {**params, "backend": backend}, decode)


def _decode_video(path: str, params: dict, backend: str, source: str) -> Video:
    def plan(n: int, native: float):
        return plan_frames(n, native, fps=params["fps"], nframes=params["nframes"],
                           start=params["start"], end=params["end"], max_frames=params["max_frames"])

    errors = []
    for decoder in _VIDEO_DECODERS[backend]():
        try:
            frames, idx, sample_fps, n, native = decoder(path, plan)
            break
        except PlanError as e:
            raise _fail(source, "video", path, str(e)) from None
        except ImportError:
            raise
        except Exception as e:  # decoders raise their own types (DECORDError, av.FFmpegError, ...)
            errors.append(f"{decoder.__name__[8:]}: {str(e).strip().splitlines()[-1][:300]}")
    else:
        raise _fail(source, "cannot decode video", path, "; ".join(errors))
    if params["max_total_pixels"]:
        frames = _resize_frames(frames, int(params["max_total_pixels"]))
    return Video(frames=np.ascontiguousarray(frames, dtype=np.uint8), fps=float(sample_fps),
                 timestamps=[i / native for i in idx], duration=n / native, path=str(path))


def frame_folder(path: str, frame_fps: float | None, source: str = "") -> tuple[list[Path], float]:
    """(sorted frame files, their rate) of a folder of extracted frames: image files in natural
    order (frame_2 before frame_10), at `frame_fps` (the record's field) or the number in the
    folder's fps.txt. A MediaError says what is missing."""
    folder = Path(path)
    files = sorted((f for f in folder.iterdir() if f.suffix.lower() in FRAME_SUFFIXES),
                   key=lambda f: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", f.name)])
    if not files:
        raise _fail(source, "video", path, f"a folder with no frames in it (a frame folder holds "
                                           f"image files: {', '.join(FRAME_SUFFIXES)})")
    if frame_fps is None and (folder / "fps.txt").is_file():
        try:
            frame_fps = float((folder / "fps.txt").read_text().strip())
        except ValueError:
            raise _fail(source, "video", path, "fps.txt must hold one number (frames per "
                                               "second)") from None
    if frame_fps is None or not frame_fps > 0:
        raise _fail(source, "video", path, f"a frame folder of {len(files)} frames at an unknown "
                                           f"rate: give the record a 'frame_fps' field (frames per "
                                           f"second the frames were extracted at) or write the "
                                           f"number to {folder / 'fps.txt'}")
    return files, float(frame_fps)


def _decode_frames(path: str, files: list[Path], native: float, params: dict,
                   source: str) -> Video:
    try:
        idx, sample_fps = plan_frames(len(files), native, fps=params["fps"],
                                      nframes=params["nframes"], start=params["start"],
                                      end=params["end"], max_frames=params["max_frames"])
    except PlanError as e:
        raise _fail(source, "video", path, str(e)) from None
    frames = [np.asarray(load_image(str(files[i]), source)) for i in idx]
    if len({f.shape for f in frames}) > 1:
        raise _fail(source, "video", path, f"frames differ in size ({frames[0].shape[1]}x"
                                           f"{frames[0].shape[0]} and others)")
    stacked = np.stack(frames)
    if params["max_total_pixels"]:
        stacked = _resize_frames(stacked, int(params["max_total_pixels"]))
    return Video(frames=np.ascontiguousarray(stacked, dtype=np.uint8), fps=float(sample_fps),
                 timestamps=[i / native for i in idx], duration=len(files) / native,
                 path=str(path))


# The decoders tried in turn per video `backend`; auto skips decord where it is not installed.
_VIDEO_DECODERS = {
    "auto": lambda: (_decode_pyav,) if _import_decord() is None else (_decode_decord, _decode_pyav),
    "decord": lambda: (_decode_decord,),
    "pyav": lambda: (_decode_pyav,),
}

# ----------------------------------------------------------------------------------- samples ----

def _video_overrides(sample: Sample) -> dict:
    out = {}
    for field, kw in VIDEO_FIELD_OVERRIDES.items():
        value = sample.fields.get(field)
        if value is None:
            continue
        positive = kw in ("fps", "nframes", "max_frames", "frame_fps")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or value < 0 or (positive and value <= 0)):
            raise MediaError(f"{sample.source}: field {field!r} must be a "
                             f"{'positive' if positive else 'non-negative'} number, got {value!r:.40}")
        out[kw] = value
    if "fps" in out and "nframes" in out:
        raise MediaError(f"{sample.source}: fields 'fps' and 'nframes' both set; keep one")
    return out


def load_media(sample: Sample, *, video_kwargs: dict | None = None,
               audio_kwargs: dict | None = None, cache: "DecodeCache | None" = None,
               stats: dict | None = None, image_kwargs: dict | None = None) -> dict[str, list]:
    """All media of a sample, decoded: {"images": [PIL RGB], "videos": [Video], "audios":
    [float32 mono at 16 kHz]}. With `image_kwargs` ({"min_pixels", "max_pixels"}, either
    None), images are resized by qwen-vl-utils (`fit_image`); without, they keep their size.

    Per-sample overrides from `sample.fields` win over `video_kwargs`: "video_start", "video_end",
    "fps", "nframes", "max_frames" (a record's "fps" replaces a configured "nframes" and vice
    versa). `stats` collects counts such as "audio_truncated".
    """
    vkw = dict(video_kwargs or {})
    over = _video_overrides(sample) if sample.videos else {}
    if "fps" in over:
        vkw.pop("nframes", None)
    if "nframes" in over:
        vkw.pop("fps", None)
    vkw.update(over)
    akw = dict(audio_kwargs or {})
    return {
        "images": [load_image(p, sample.source) if image_kwargs is None else
                   fit_image(load_image(p, sample.source, image_kwargs.get("max_pixels")),
                             source=sample.source, path=p, **image_kwargs)
                   for p in sample.images],
        "videos": [load_video(p, source=sample.source, cache=cache, **vkw) for p in sample.videos],
        "audios": [load_audio(p, source=sample.source, cache=cache, stats=stats, **akw)
                   for p in sample.audios],
    }
