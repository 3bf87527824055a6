"""A trajectory, turn by turn: each model turn's text, then each call it made with what the call
read, drawn on the original media from the call's `seen` record (tooldraw.py): the crop box on
its image beside the crop that came back, the returned frames on the video's timeline, the
clip's span on the audio's waveform. A failed call shows its error kind and the message the
model read. An environment's turns (no calls) are each followed by the observation its world
answered with: the images, clips (frames left to right) and audio the run wrote for it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.report import draw, media, tooldraw
from mmrl.report.markup import esc, guarded, img, placeholder
from mmrl.report.media import DISPLAY_SIDE


def is_trajectory(r: dict) -> bool:
    return isinstance(r.get("turns"), list) and bool(r["turns"])


def trajectory_html(r: dict, roots: list[Path]) -> str:
    """Every model turn of record `r` (rollouts.jsonl), each followed by its calls and the
    size of the observation that answered them."""
    turns = r["turns"]
    calls = [c for c in r.get("calls") or [] if isinstance(c, dict)]
    observations = [o for o in r.get("observations") or [] if isinstance(o, dict)]
    answered = 0  # observation j answers the j-th turn that made calls
    parts = []
    for k, text in enumerate(turns):
        made = [c for c in calls if c.get("turn") == k]
        body = f'<pre class="completion">{esc(text if isinstance(text, str) else repr(text))}</pre>'
        body += "".join(call_html(c, roots) for c in made)
        if not calls and k < len(observations):  # an environment: its world's answer
            body += observation_html(observations[k], roots)
        if made:
            if answered < len(observations):
                body += (f'<div class="obs">observation: {esc(observations[answered].get("length"))}'
                         f' tokens back to the model</div>')
            else:
                body += '<div class="obs">no observation: it did not fit the token budget</div>'
            answered += 1
        last = " · final" if k == len(turns) - 1 else ""
        parts.append(f'<div class="turn"><div class="tlabel">turn {k + 1}{last}</div>{body}</div>')
    return f'<div class="turns">{"".join(parts)}</div>'


def observation_html(o: dict, roots: list[Path]) -> str:
    """An environment's observation: its size, and each media item the run wrote for it."""
    items = [m for m in o.get("media") or [] if isinstance(m, dict) and isinstance(m.get("path"), str)]
    pictures = [guarded(m["path"], roots, lambda path, m=m: _observed_html(m, path)) for m in items]
    head = f'<div class="obs">observation: {esc(o.get("length"))} tokens back to the model</div>'
    return head + (f'<div class="tool-pics">{"".join(pictures)}</div>' if pictures else "")


def _observed_html(item: dict, path: Path) -> str:
    kind = item.get("kind")
    if kind == "image":
        shown, _ = draw.display(media.load_image(path), DISPLAY_SIDE // 2)
        caption = "the image it was shown"
    elif kind == "video":
        strip = media.load_image(path)
        n = max(1, int(item.get("frames") or 1))
        width = strip.width // n
        frames = [strip.crop((i * width, 0, (i + 1) * width, strip.height)) for i in range(n)]
        shown = draw.fit_width(draw.frame_strip([draw.display(f, DISPLAY_SIDE // 2)[0]
                                                 for f in frames]), min(n, 4) * DISPLAY_SIDE // 2)
        caption = f"the clip it was shown: {n} frames at {item.get('fps')} fps, left to right"
    elif kind == "audio":
        samples, sr = media.load_audio(path)
        shown = draw.audio_picture(samples, sr)
        caption = f"the {samples.size / sr:.1f}s audio it heard: waveform + spectrogram"
    else:
        return placeholder(f"an observation item of kind {kind!r}, which the report cannot draw")
    return (f'<figure>{img(draw.png_data_uri(shown), "obs-" + str(kind), str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def call_html(c: dict, roots: list[Path]) -> str:
    args = json.dumps(c.get("arguments"), default=str)
    head = (f'<div class="chead">call <b>{esc(c.get("name") or "(unparsed)")}</b> '
            f'<code>{esc(args[:300])}</code></div>')
    if c.get("error"):
        message = c.get("message") or "(message not recorded)"
        return (f'<div class="call">{head}<div class="tool-error">error ({esc(c["error"])}): '
                f'{esc(message)}</div></div>')
    seen = [s for s in c.get("seen") or [] if isinstance(s, dict) and isinstance(s.get("path"), str)]
    pictures = [guarded(s["path"], roots, lambda path, s=s: _seen_html(s, path)) for s in seen]
    if not pictures:
        pictures = ['<div class="obs">answered; the call recorded nothing to draw (a tool says '
                    'what it read with mmrl.tools.base.looked_at)</div>']
    return f'<div class="call">{head}<div class="tool-pics">{"".join(pictures)}</div></div>'


def _seen_html(seen: dict, path: Path) -> str:
    kind = seen.get("media")
    if kind == "image":
        return _crop_html(seen, path)
    if kind == "video":
        return _frames_html(seen, path)
    if kind == "audio":
        return _clip_html(seen, path)
    return placeholder(f"a call read media of kind {kind!r}, which the report cannot draw: {path}")


def _numbers(value: Any, n: int, what: str) -> list[float]:
    if not isinstance(value, list) or len(value) != n or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ValueError(f"the call's record has no {what} ({n} numbers), got {value!r:.80}")
    return [float(v) for v in value]


def _crop_html(seen: dict, path: Path) -> str:
    image = media.load_image(path)
    box = _numbers(seen.get("box"), 4, "box")
    drawn, _ = tooldraw.draw_crop_box(image, box)
    crop = tooldraw.returned_crop(image, box, seen.get("returned"))
    shown, _ = draw.display(crop, DISPLAY_SIDE // 2)
    caption = (f"crop box {[round(v) for v in box]} on the {image.width}x{image.height} original "
               f"(blue) · the {crop.width}x{crop.height} crop that came back")
    return (f'<figure>{img(draw.png_data_uri(drawn), "tool-crop-box", str(path))}'
            f'{img(draw.png_data_uri(shown), "tool-crop", "crop of " + str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _frames_html(seen: dict, path: Path) -> str:
    start, end = _numbers(seen.get("span"), 2, "span")
    (duration,) = _numbers([seen.get("duration")], 1, "duration")
    times = seen.get("timestamps") or []
    times = _numbers(times, len(times), "timestamps")
    frames = media.frames_at(path, tuple(times))
    im = tooldraw.draw_frames_on_timeline(frames, times, (start, end), duration)
    at = ", ".join(f"{t:.2f}" for t in times)
    caption = (f"{len(frames)} frames of {start:g}–{end:g}s (shaded) of the {duration:.1f}s "
               f"video, each joined to its time (blue ticks: {at} s)")
    return (f'<figure>{img(draw.png_data_uri(im), "tool-frames", str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')


def _clip_html(seen: dict, path: Path) -> str:
    start, end = _numbers(seen.get("span"), 2, "span")
    samples, sr = media.load_audio(path)
    im = tooldraw.draw_waveform_span(samples, sr, (start, end))
    caption = (f"the clip {start:g}–{end:g}s (shaded) on the waveform of the "
               f"{samples.size / sr:.1f}s original")
    return (f'<figure>{img(draw.png_data_uri(im), "tool-clip", str(path))}'
            f'<figcaption>{esc(caption)}</figcaption></figure>')
