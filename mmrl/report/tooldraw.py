"""Pictures of what a tool call read of its original media, from the call's `seen` record
(mmrl.tools.base.looked_at): the crop box on the original image beside the crop that came back,
the returned frames on the video's timeline, the clip's span on the audio's waveform.

One colour for everything a call read (TOOL, blue) and one for a span it covered (SPAN, light
orange), distinct from the prediction red and ground-truth green of draw.py.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from mmrl.report.draw import AXIS_HEIGHT, LINE, envelope, display, time_axis, time_x
from mmrl.report.media import DISPLAY_SIDE

TOOL = (0, 90, 230)
SPAN = (255, 205, 120)
LANE = (232, 232, 232)
WAVE = (60, 60, 60)
THUMB_HEIGHT = 54


def draw_crop_box(image: Image.Image, box: list[float],
                  side: int = DISPLAY_SIDE) -> tuple[Image.Image, float]:
    """A display-sized copy of the original `image` with the crop `box` (original pixels, x2/y2
    exclusive as PIL crops) outlined in TOOL; and the scale from file to drawn pixels."""
    out, scale = display(image, side)
    x1, y1, x2, y2 = (v * scale for v in box)
    ImageDraw.Draw(out).rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=TOOL,
                                  width=LINE)
    return out, scale


def returned_crop(image: Image.Image, box: list[float], returned: list[int] | None) -> Image.Image:
    """The crop the model got back: the box of the original resized to the size the tool
    returned (bicubic, as qwen-vl-utils' fetch_image resizes it); the region itself without one."""
    region = image.crop(tuple(int(v) for v in box))
    if returned and len(returned) == 2 and min(returned) > 0:
        region = region.resize((int(returned[0]), int(returned[1])), Image.BICUBIC)
    return region


def draw_frames_on_timeline(frames: list[Image.Image], timestamps: list[float],
                            span: tuple[float, float], duration: float,
                            width: int = 2 * DISPLAY_SIDE) -> Image.Image:
    """The returned frames in a row, each joined by a line to its time on the video's timeline,
    where the asked span is shaded (SPAN) and each frame's time is a TOOL tick."""
    n = max(1, len(frames))
    cell = width / n
    joins, lane = 22, 14
    lane_top = THUMB_HEIGHT + joins
    out = Image.new("RGB", (width, lane_top + lane + AXIS_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    draw.rectangle([0, lane_top, width - 1, lane_top + lane - 1], fill=LANE)
    a, b = (time_x(t, duration, width) for t in span)
    draw.rectangle([round(a), lane_top, round(b), lane_top + lane - 1], fill=SPAN)
    for i, (frame, t) in enumerate(zip(frames, timestamps)):
        scale = min(THUMB_HEIGHT / max(frame.height, 1), (cell - 4) / max(frame.width, 1))
        thumb = frame.resize((max(1, round(frame.width * scale)),
                              max(1, round(frame.height * scale))), Image.BILINEAR)
        cx = (i + 0.5) * cell
        out.paste(thumb, (round(cx - thumb.width / 2), (THUMB_HEIGHT - thumb.height) // 2))
        tx = round(time_x(t, duration, width))
        draw.line([cx, THUMB_HEIGHT + 1, tx, lane_top - 1], fill=(150, 150, 150))
        draw.rectangle([tx - 1, lane_top, tx + 1, lane_top + lane - 1], fill=TOOL)  # 3 px: seen
    time_axis(draw, lane_top + lane, duration, width)
    return out


def draw_waveform_span(samples: np.ndarray, sr: int, span: tuple[float, float],
                       width: int = 2 * DISPLAY_SIDE, height: int = 72) -> Image.Image:
    """The original audio's waveform (min/max per pixel column) with the clip's span shaded."""
    seconds = samples.size / max(sr, 1)
    out = Image.new("RGB", (width, height + AXIS_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    a, b = (time_x(t, seconds, width) for t in span)
    draw.rectangle([round(a), 0, round(b), height - 1], fill=SPAN)
    _, lo, hi = envelope(samples, sr, columns=width)
    mid, amp = (height - 1) / 2, (height - 4) / 2
    for i, (l, h) in enumerate(zip(lo, hi)):
        x = i * width / len(lo)
        draw.line([x, mid - float(np.clip(h, -1, 1)) * amp, x, mid - float(np.clip(l, -1, 1)) * amp],
                  fill=WAVE)
    time_axis(draw, height, seconds, width)
    return out
