"""The built-in tools, one per modality, each reading the ORIGINAL full-resolution media (never
the downsampled model input):

- `crop`: a box in the model's input coordinates -> that region of the original image, resized
  under the image budget (a small region comes back larger than the model first saw it).
- `frames`: a time span of the original video -> its frames at a higher fps.
- `audio_clip`: a time span of the original audio -> that clip as its own audio.

Arguments the model gives are checked here; anything wrong raises ToolInputError with a message
the model reads (bad_arguments, bad_box, bad_span). Keyword-only parameters are settings
(`tools.use[].params`), never the model's to set.
"""
from __future__ import annotations

import math
from typing import Any

from mmrl.data.media import enlarge, fit_image, load_audio, load_image, load_video
from mmrl.tools.base import TOOLS, ToolContext, ToolInputError, looked_at, tool_spec
from mmrl.types import AUDIO_SAMPLING_RATE
from rewards.boxes import check_coords, pixel_scale


def _numbers(value: Any, n: int, what: str) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != n or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in value):
        raise ToolInputError("bad_arguments", f"{what} must be {n} finite numbers, got {value!r:.80}")
    return [float(v) for v in value]


def _seconds(start: Any, end: Any, duration: float, what: str, shortest: float = 0.0):
    start, end = _numbers([start, end], 2, "start and end")
    if not 0 <= start < end or end > duration + 1e-6:
        raise ToolInputError("bad_span", f"span {start:g}..{end:g} s is not inside the {what} "
                             f"(0..{duration:g} s, start < end)")
    if end - start < shortest:
        raise ToolInputError("bad_span", f"span {start:g}..{end:g} s is shorter than {shortest:g} s")
    return start, end


def clamp_box(box: list[float], width: float, height: float) -> list[float]:
    """`box` (x1, y1, x2, y2) clamped to a width x height frame; bad_box when it is reversed,
    empty, or lies wholly outside."""
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        raise ToolInputError("bad_box", f"box {box} is empty or reversed (need x1 < x2, y1 < y2)")
    clamped = [max(0.0, x1), max(0.0, y1), min(width, x2), min(height, y2)]
    if clamped[2] <= clamped[0] or clamped[3] <= clamped[1]:
        raise ToolInputError("bad_box", f"box {box} lies outside the image ({width:g} x {height:g})")
    return clamped


@TOOLS.register("crop")
@tool_spec({
    "description": "Zoom in on a region of an image to see it at a higher resolution.",
    "parameters": {"type": "object", "required": ["bbox_2d"], "properties": {
        "bbox_2d": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                    "description": "[x1, y1, x2, y2]: the region, top-left then bottom-right"},
        "image": {"type": "integer", "description": "which image, from 1 (default 1)"}}}})
def crop(context: ToolContext, bbox_2d: Any, image: Any = 1, *, coords: str | None = None,
         min_pixels: int | None = None, max_pixels: int | None = None) -> list:
    """Zoom in on a region of an image: `bbox_2d` = [x1, y1, x2, y2] in the image as you see it.

    `coords` (a setting; default: the family's own, `ModelAdapter.box_coords`): the convention of
    the box, as the box rewards name them -- resized (the model's input frame, Qwen2.5-VL),
    norm1000 (0..1000, Qwen2-VL / Qwen3-VL), norm1, absolute (original pixels). The crop is taken from the original image, grown to at least one
    merged patch of original pixels, and resized under min_pixels..max_pixels (default: the
    model's image budget)."""
    index, path = context.pick("images", image)
    box = _numbers(bbox_2d, 4, "bbox_2d")
    original = context.cached(("image", path), lambda: load_image(path, context.sample.source))
    w, h = original.size
    in_w, in_h = context.input_sizes[index]
    kind = check_coords(coords or context.coords)
    frame = {"resized": (in_w, in_h), "norm1000": (1000, 1000), "norm1": (1, 1),
             "absolute": (w, h)}[kind]
    box = clamp_box(box, *frame)
    sx, sy = pixel_scale(kind, (w, h), (in_w, in_h), *context.image_pixels)
    x1, y1, x2, y2 = enlarge([box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy],
                             context.factor, w, h)
    lo, hi = context.image_pixels
    lo, hi = lo if min_pixels is None else min_pixels, hi if max_pixels is None else max_pixels
    out = context.cached(("crop", path, (x1, y1, x2, y2), lo, hi), lambda: fit_image(
        original.crop((x1, y1, x2, y2)), lo, hi, factor=context.factor))
    looked_at("image", path, size=[w, h], box=[x1, y1, x2, y2], returned=list(out.size))
    return [out]


def span_spec(description: str, kind: str) -> dict:
    """The spec of a tool taking a time span of media item `kind` (video, audio)."""
    seconds = {"type": "number", "description": f"seconds from the start of the {kind}"}
    return {"description": description, "parameters": {
        "type": "object", "required": ["start", "end"], "properties": {
            "start": seconds, "end": seconds,
            kind: {"type": "integer", "description": f"which {kind}, from 1 (default 1)"}}}}


@TOOLS.register("frames")
@tool_spec(span_spec("Look again at a time span of a video, at a higher frame rate.", "video"))
def frames(context: ToolContext, start: Any, end: Any, video: Any = 1, *, fps: float = 4.0,
           max_frames: int = 16) -> list:
    """Look again at a time span of a video: frames from `start` to `end` (seconds) at a higher
    frame rate. `fps` and `max_frames` are settings; the frames keep the model's per-frame
    budget (the processor's)."""
    _, path = context.pick("videos", video)
    duration = context.cached(("video_duration", path), lambda: load_video(
        path, nframes=2, source=context.sample.source).duration)
    start, end = _seconds(start, end, duration, "video")
    clip = context.cached(("frames", path, start, end, fps, max_frames), lambda: load_video(
        path, fps=fps, start=start, end=min(end, duration), max_frames=max_frames,
        source=context.sample.source))
    looked_at("video", path, duration=float(duration), span=[start, end],
              timestamps=[float(t) for t in clip.timestamps])
    return [clip, f"frames {start:g}-{end:g} s at {clip.fps:.3g} fps"]


@TOOLS.register("audio_clip")
@tool_spec(span_spec("Listen again to a time span of an audio track, as its own clip.", "audio"))
def audio_clip(context: ToolContext, start: Any, end: Any, audio: Any = 1, *,
               min_seconds: float = 0.1) -> list:
    """Listen again to a time span of an audio track: the clip from `start` to `end` (seconds)
    as its own audio. Clips shorter than `min_seconds` are refused (Qwen2-Audio's encoder fails
    on 50 ms)."""
    _, path = context.pick("audios", audio)
    wave = context.cached(("audio", path), lambda: load_audio(path, source=context.sample.source))
    sr = AUDIO_SAMPLING_RATE
    start, end = _seconds(start, end, len(wave) / sr, "audio", shortest=min_seconds)
    looked_at("audio", path, duration=len(wave) / sr, span=[start, end])
    return [wave[int(round(start * sr)):int(round(end * sr))], f"audio {start:g}-{end:g} s"]
