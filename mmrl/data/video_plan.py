"""What a video decode yields and which frames it takes: `Video` (the sampled frames and their
rate; defined in mmrl.types, where an environment can name it), `plan_frames` (qwen-vl-utils'
frame choice) and the `DecodeCache` protocol. Decoding itself is in mmrl.data.media, which
re-exports these names."""
from __future__ import annotations

import math
from typing import Callable, Protocol

import numpy as np

from mmrl.data.media_errors import MediaError
from mmrl.types import Video  # defined with the shared records, where environments name it

TEMPORAL_PATCH = 2  # Qwen-VL: 2 frames per temporal patch -> even frame counts
DEFAULT_FPS = 2.0


class DecodeCache(Protocol):
    """What the decoders need of a cache (mmrl.data.cache.MediaCache is one): return the stored
    value for (file, params), else call `decode`, store and return its result. A protocol, so
    media.py does not depend on the cache module (which depends on `Video` here)."""

    def video(self, path: str, params: dict, decode: Callable[[], Video]) -> Video: ...

    def audio(self, path: str, params: dict,
              decode: Callable[[], tuple[np.ndarray, bool]]) -> tuple[np.ndarray, bool]: ...


class PlanError(MediaError):
    """The requested segment does not fit the video: no other backend can do better."""


def plan_frames(n_frames: int, native_fps: float, *, fps: float | None = None,
                nframes: int | None = None, start: float | None = None, end: float | None = None,
                max_frames: int = 64) -> tuple[list[int], float]:
    """(frame indices, sampling fps) for a video of `n_frames` at `native_fps`: qwen-vl-utils'
    rule (its decord reader), so frames are the ones the anchors and users' eval scripts pick.

    The window [start, end] (seconds) becomes frames ceil(start * fps_native) .. floor(end *
    fps_native) (`calculate_video_frame_range`); T = `smart_nframes` (fps mode: floor-even of
    window * fps within [2, max_frames]; nframes mode: round-even nframes, here first clamped to
    [2, max_frames] and the window's frames); frames are `linspace(first, last, T)` rounded;
    the sampling fps is T / window frames * native fps. Own code only where the library raises:
    a window holding a single frame gives 2 copies of it (T must be even, >= 2).

    >>> plan_frames(16, 4.0, fps=2.0)
    ([0, 2, 4, 6, 9, 11, 13, 15], 2.0)
    >>> plan_frames(16, 4.0, nframes=4, start=1.0)
    ([4, 8, 11, 15], 1.3333333333333333)
    """
    import torch
    from qwen_vl_utils.vision_process import calculate_video_frame_range, smart_nframes

    if n_frames <= 0 or not native_fps or native_fps <= 0:
        raise PlanError(f"no decodable frames (frames={n_frames}, fps={native_fps})")
    duration = n_frames / native_fps
    s = 0.0 if start is None else float(start)
    if s < 0 or s >= duration or (end is not None and float(end) <= s):
        raise PlanError(f"segment start={start}, end={end} (seconds) does not fit the video "
                         f"(duration {duration:.3f} s)")
    window = {k: float(v) for k, v in (("video_start", start), ("video_end", end)) if v is not None}
    try:
        first, last, total = calculate_video_frame_range(window, n_frames, native_fps)
    except ValueError:  # the window holds one frame (or the file does): 2 copies of it
        first = min(n_frames - 1, math.ceil(s * native_fps))
        last, total = first, 1
    if total < TEMPORAL_PATCH:
        return [first] * TEMPORAL_PATCH, TEMPORAL_PATCH / total * native_fps
    cap = max(TEMPORAL_PATCH, min(max_frames, total) // TEMPORAL_PATCH * TEMPORAL_PATCH)
    if nframes is not None:
        ele = {"nframes": min(max(int(nframes), TEMPORAL_PATCH), cap)}
    else:
        ele = {"fps": DEFAULT_FPS if fps is None else float(fps), "min_frames": TEMPORAL_PATCH,
               "max_frames": cap}
    t = smart_nframes(ele, total_frames=total, video_fps=native_fps)
    idx = torch.linspace(first, last, t).round().long().tolist()  # the library's exact rounding
    return idx, t / total * native_fps
