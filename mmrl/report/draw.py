"""Pictures of one group's media: its image with the ground-truth boxes and each completion's,
a frame strip (+ a timeline of segments for a temporal task) for its video, a waveform +
spectrogram for its audio. Everything returns a PIL image; rollouts.py embeds it as a PNG data URI.

Colours are fixed so a reader learns them once: prediction red, ground truth green.
"""
from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image, ImageDraw

from mmrl.report.media import DISPLAY_SIDE, display_scale

PRED = (230, 0, 0)
GT = (0, 170, 0)
LINE = 3  # px at display scale: visible on a 320 px image, thin enough not to hide objects


def png_data_uri(im: Image.Image) -> str:
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def draw_boxes(image: Image.Image, pred: list, gt: list, side: int = DISPLAY_SIDE,
               labels: list[str] | None = None) -> tuple[Image.Image, float]:
    """A display-sized copy of `image` with ground truth (green) under predictions (red), each
    prediction's label (its rollout number) just above its top-left corner.

    Returns the drawn image and the scale from file pixels to drawn pixels (tests use it to
    find the edges). Nearest-neighbour upscaling keeps tiny synthetic images crisp.
    """
    out, scale = display(image, side)
    draw = ImageDraw.Draw(out)
    for boxes, colour in ((gt, GT), (pred, PRED)):  # predictions on top: they are what changed
        for x1, y1, x2, y2 in boxes:
            xa, xb = sorted((x1 * scale, x2 * scale))  # degenerate answers may swap corners
            ya, yb = sorted((y1 * scale, y2 * scale))
            draw.rectangle([xa, ya, xb, yb], outline=colour, width=LINE)
    for (x1, y1, x2, y2), label in zip(pred, labels or []):
        x, y = min(x1, x2) * scale, min(y1, y2) * scale  # outside the box: never over its object
        draw.text((max(0.0, x), y - 12 if y >= 12 else max(y1, y2) * scale + 2), label, fill=PRED)
    return out, scale


def display(image: Image.Image, side: int = DISPLAY_SIDE) -> tuple[Image.Image, float]:
    """`image` with its long side `side` px, and the scale from file pixels to drawn pixels."""
    scale = display_scale(image.width, image.height, side)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    resample = Image.NEAREST if scale > 1 else Image.BILINEAR
    return image.resize(size, resample), scale


def fit_width(strip: Image.Image, width: int = 2 * DISPLAY_SIDE) -> Image.Image:
    return strip.resize((width, max(1, round(strip.height * width / strip.width))))


def frame_strip(frames: list[Image.Image]) -> Image.Image:
    """Frames side by side, each centred in an equal-width cell (cell i = time bin i), with a
    white gap so that similar neighbouring frames still read as separate pictures."""
    gap = 3
    cell_w = max(f.width for f in frames) + gap
    height = max(f.height for f in frames)
    strip = Image.new("RGB", (cell_w * len(frames), height), (255, 255, 255))
    for i, f in enumerate(frames):
        strip.paste(f, (i * cell_w + (cell_w - f.width) // 2, (height - f.height) // 2))
    return strip


def draw_timeline(strip: Image.Image | None, duration: float,
                  pred: list[tuple[str, tuple[float, float] | None]], gt: tuple[float, float],
                  width: int = 2 * DISPLAY_SIDE) -> Image.Image:
    """The frame strip above a time axis: the ground-truth segment (green) in the top lane, then
    one lane per prediction (red, its label beside it; an empty lane where it has none). Lanes
    instead of overlap so that every segment stays visible."""
    strip = fit_width(strip, width) if strip is not None else None
    strip_h = strip.height if strip is not None else 0
    lane, pad = 10, 3
    lanes = 1 + len(pred)
    axis_top = strip_h + pad + lanes * (lane + pad)
    out = Image.new("RGB", (width, axis_top + AXIS_HEIGHT), (255, 255, 255))
    if strip is not None:
        out.paste(strip, (0, 0))
    draw = ImageDraw.Draw(out)
    top = strip_h + pad
    draw.rectangle([0, top - 1, width - 1, axis_top - 1], fill=(235, 235, 235))

    def x(t: float) -> float:
        return time_x(t, duration, width)

    rows = [("gt", gt, GT)] + [(label, seg, PRED) for label, seg in pred]
    for k, (label, seg, colour) in enumerate(rows):
        y = top + k * (lane + pad)
        if seg is not None:
            a, b = seg
            draw.rectangle([x(a), y, max(x(b), x(a) + 1), y + lane], fill=colour)
            end = max(x(b), x(a) + 1)
            tx = end + 4 if end + 4 + 6 * len(label) < width else max(0.0, x(a) - 4 - 6 * len(label))
            draw.text((tx, y - 1), label, fill=(60, 60, 60))
    time_axis(draw, axis_top, duration, width)
    return out


AXIS_HEIGHT = 18  # px below `top` that time_axis draws on (tick and label)


def time_x(t: float, duration: float, width: int) -> float:
    """The x of time `t` on a `width`-px axis from 0 to `duration` (clamped to the picture)."""
    return max(0.0, min(width - 1.0, t / duration * (width - 1))) if duration > 0 else 0.0


def time_axis(draw: ImageDraw.ImageDraw, top: int, duration: float, width: int) -> None:
    """Ticks and labels at 0, 20%, ..., 100% of `duration`, from `top` down."""
    ticks, pad = 5, 3
    for i in range(ticks + 1):
        t = duration * i / ticks
        tx = time_x(t, duration, width)
        draw.line([tx, top, tx, top + pad], fill=(90, 90, 90))
        label = f"{t:.1f}s"
        anchor_x = min(max(0, tx - 3 * len(label)), width - 6 * len(label))
        draw.text((anchor_x, top + pad), label, fill=(60, 60, 60))


def audio_picture(samples: np.ndarray, sr: int, width_px: int = 2 * DISPLAY_SIDE) -> Image.Image:
    """Waveform (min/max envelope) above a log-magnitude spectrogram, sharing the time axis."""
    # matplotlib's object API, not pyplot: no global figure registry, no backend switching
    # behind the caller's back (the report may run inside a notebook or the trainer).
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(width_px / dpi, 2.6), dpi=dpi)
    ax_w, ax_s = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1.6]})
    seconds = samples.size / sr
    env_t, lo, hi = envelope(samples, sr, columns=width_px)
    ax_w.fill_between(env_t, lo, hi, color="#3366aa", linewidth=0)
    ax_w.set_ylim(-1.05, 1.05)
    ax_w.set_yticks([])
    ax_w.set_ylabel("wave", fontsize=7)
    db, freqs = _spectrogram(samples, sr)
    ax_s.imshow(db, origin="lower", aspect="auto", cmap="magma",
                extent=(0.0, seconds, 0.0, freqs[-1] / 1000.0))
    ax_s.set_ylabel("kHz", fontsize=7)
    ax_s.set_xlabel("seconds", fontsize=7)
    for ax in (ax_w, ax_s):
        ax.tick_params(labelsize=6)
    fig.tight_layout(pad=0.3, h_pad=0.2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    return Image.open(buf).convert("RGB")


def envelope(samples: np.ndarray, sr: int, columns: int):
    """Per-pixel-column min and max: a faithful waveform at any length without plotting
    millions of points."""
    columns = max(1, min(columns, samples.size))
    edges = np.linspace(0, samples.size, columns + 1).astype(int)
    lo = np.minimum.reduceat(samples, edges[:-1])
    hi = np.maximum.reduceat(samples, edges[:-1])
    return edges[:-1] / sr, lo, hi


def _spectrogram(samples: np.ndarray, sr: int, n_fft: int = 512, max_frames: int = 800):
    """Magnitude STFT in dB with a Hann window; the hop grows with the clip so long audio costs
    a bounded number of frames. Plain numpy: librosa's import alone costs seconds."""
    n_fft = min(n_fft, max(16, 1 << int(np.log2(max(samples.size, 16)))))
    hop = max(n_fft // 4, (samples.size - n_fft) // max_frames + 1)
    padded = np.pad(samples, (0, max(0, n_fft - samples.size)))
    starts = np.arange(0, padded.size - n_fft + 1, hop)
    frames = np.stack([padded[s:s + n_fft] for s in starts]) * np.hanning(n_fft)
    mag = np.abs(np.fft.rfft(frames, axis=1)).T
    db = 20 * np.log10(np.maximum(mag, 1e-6))
    db = np.maximum(db, db.max() - 80.0)  # 80 dB of range: the usual display floor
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    return db, freqs
