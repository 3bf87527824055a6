"""What a tool gets and gives: its context (the sample's ORIGINAL media and the frame the model
sees them in), the errors it may raise, and its results as chat content.

A tool is a plain function `fn(**arguments)`; when it declares a `context` parameter it also
gets the trajectory's `ToolContext`. It returns text (str), an image (PIL.Image), frames (a
`mmrl.data.media.Video`: frames + sampling fps), a waveform (1-D float array at 16 kHz), or a
list of these, rendered in order. Bad input raises `ToolInputError(kind, message)`; the model
reads the message in an error observation, and the kind is counted in the metrics.
"""
from __future__ import annotations

import inspect
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from PIL import Image

from mmrl.data.media import Video, decode_limit
from mmrl.registry import Registry
from mmrl.types import AUDIO_SAMPLING_RATE, PromptFeatures

# Built-in tools by name; a "pkg.mod:fn" name imports a user tool (the registry's loader).
TOOLS: Registry[Callable] = Registry("tool")

# Every way a call can fail, each counted on its own (tools/errors/<kind>).
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "bad_box", "bad_span", "exception",
               "timeout", "too_long", "bad_result")


class ToolInputError(ValueError):
    """A call the tool refuses: `kind` is one of ERROR_KINDS (bad_box, bad_span, ...)."""

    def __init__(self, kind: str, message: str):
        if kind not in ERROR_KINDS:
            raise ValueError(f"ToolInputError kind must be one of {ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class MediaLimits:
    """The guards a tool's media result passes, the records' own (mmrl/data/media.py): an image
    or a frame of at most `pixels` (max(4 x the image budget, 16 MP), what a run decodes), at
    most `frames` frames (data.video_max_frames), audio of at most `audio_seconds`
    (data.audio_max_seconds; None: no limit, as for records)."""

    pixels: int = decode_limit(None)
    frames: int = 64
    audio_seconds: float | None = None


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    value: Any = None


@dataclass
class ToolContext:
    """One prompt's media as tools see them; shared by the G trajectories of a group (decoded
    originals are cached, under a lock: tools of several trajectories run at once).

    `input_sizes[i]` is image i's frame at the model's input (w, h) -- the coordinates a box in
    the model's own words is in; `images`/`videos`/`audios` are paths to the full-resolution
    originals (a record's full_images/full_videos/full_audios, else its media)."""

    prompt: PromptFeatures
    input_sizes: list[tuple[int, int]]
    images: list[str]
    videos: list[str]
    audios: list[str]
    factor: int = 28  # pixels per merged patch side: the smallest crop worth taking
    coords: str = "resized"  # how the model writes boxes (its adapter's box_coords)
    image_pixels: tuple[int, int] = (28 * 28 * 4, 28 * 28 * 256)  # a returned image's budget
    max_frames: int = 64  # data.video_max_frames: the most frames a result may hold
    max_audio_seconds: float | None = None  # data.audio_max_seconds
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # one group, in a worker too
    _cache: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def limits(self) -> MediaLimits:
        """The guards of this prompt's tool results (the records' rules, its image budget)."""
        return MediaLimits(pixels=decode_limit(self.image_pixels[1]), frames=self.max_frames,
                           audio_seconds=self.max_audio_seconds)

    def __getstate__(self) -> dict:
        """To a tool worker process: the sample and media paths, not the prompt's tensors, the
        cache or its locks (the worker keeps its own per uid)."""
        from mmrl.types import PromptFeatures

        state = {k: v for k, v in vars(self).items() if k not in ("_cache", "_lock")}
        state["prompt"] = PromptFeatures(sample=self.prompt.sample, tensors={})
        return state

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state, _cache={}, _lock=threading.Lock())

    @property
    def sample(self):
        return self.prompt.sample

    def cached(self, key: tuple, load):
        """`load()` once per key for every trajectory of the group: a decoded original, or a
        result the G trajectories often ask for alike (a sampled policy repeats its box). Each
        key has its own lock, so calls that load different keys run at once; a load that raises
        caches nothing (the next call raises again)."""
        with self._lock:
            slot = self._cache.setdefault(key, _Slot())
        with slot.lock:
            if not slot.done:
                slot.value, slot.done = load(), True
            return slot.value

    def pick(self, kind: str, index: Any) -> tuple[int, str]:
        """(0-based index, path) of media item `index` (1-based, as a model counts) of `kind`."""
        paths = getattr(self, kind)
        if not paths:
            raise ToolInputError("bad_arguments", f"this sample has no {kind}")
        if isinstance(index, bool) or not isinstance(index, (int, float)) \
                or not float(index).is_integer() or not 1 <= index <= len(paths):
            raise ToolInputError("bad_arguments", f"{kind[:-1]} must be 1..{len(paths)}, got {index!r}")
        return int(index) - 1, paths[int(index) - 1]


def as_items(value: Any, limits: MediaLimits = MediaLimits()) -> list:
    """A tool's return value as a list of result items (str, PIL image, Video, waveform);
    TypeError names what cannot be shown to the model (the shapes the processors accept) or
    what is over the records' media guards (`limits`)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    items = [_item(v, limits) for v in values]
    if not items:
        raise TypeError("the tool returned nothing to show")
    return items


def _pixels(w: int, h: int, what: str, limits: MediaLimits) -> None:
    if w * h > limits.pixels:
        raise TypeError(f"{what} of {w}x{h} is {w * h / 1e6:.1f} MP, over the "
                        f"{limits.pixels / 1e6:.1f} MP a run decodes (the records' limit: max(4 x "
                        f"the image budget, 16 MP)); return a smaller one")


def _item(v: Any, limits: MediaLimits):
    if isinstance(v, str):
        return v
    if isinstance(v, Image.Image):
        w, h = v.size
        if min(w, h) < 1 or max(w, h) / min(w, h) > 200:
            raise TypeError(f"an image of {w}x{h}: sides must be >= 1 px with an aspect ratio "
                            f"<= 200 (Qwen-VL rejects others)")
        _pixels(w, h, "an image", limits)
        return v.convert("RGB") if v.mode != "RGB" else v
    if isinstance(v, Video):
        frames = np.asarray(v.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames) or not v.fps > 0:
            raise TypeError(f"a Video needs frames [T, H, W, 3] (T >= 1) and fps > 0, got "
                            f"{tuple(frames.shape)} at {v.fps} fps")
        if len(frames) > limits.frames:
            raise TypeError(f"a Video of {len(frames)} frames, over the {limits.frames} a clip may "
                            f"have (data.video_max_frames)")
        _pixels(frames.shape[2], frames.shape[1], "a frame", limits)
        return v
    if isinstance(v, np.ndarray) and v.ndim == 1 and np.issubdtype(v.dtype, np.floating):
        if len(v) < AUDIO_SAMPLING_RATE // 10:
            raise TypeError(f"a waveform of {len(v)} samples: at least 0.1 s "
                            f"({AUDIO_SAMPLING_RATE // 10} samples at {AUDIO_SAMPLING_RATE} Hz)")
        if limits.audio_seconds is not None and len(v) > limits.audio_seconds * AUDIO_SAMPLING_RATE:
            raise TypeError(f"a waveform of {len(v) / AUDIO_SAMPLING_RATE:g} s, over "
                            f"data.audio_max_seconds={limits.audio_seconds:g}")
        return v.astype(np.float32)
    if isinstance(v, np.ndarray) and v.ndim == 4:
        raise TypeError("frames need their sampling fps: return mmrl.data.media.Video(frames=..., "
                        "fps=..., timestamps=..., duration=...) instead of a bare array")
    raise TypeError(f"a tool may return str, PIL.Image, mmrl.data.media.Video or a 1-D float "
                    f"waveform at {AUDIO_SAMPLING_RATE} Hz (or a list of them), not "
                    f"{type(v).__name__}")


# Result item class -> (chat content type, media kind).
_ITEM_KINDS = {Image.Image: ("image", "images"), Video: ("video", "videos"),
               np.ndarray: ("audio", "audios")}


def as_content(items: list) -> tuple[list[dict], dict[str, list]]:
    """(chat content items, media by kind in order) of one call's result."""
    content: list[dict] = []
    media: dict[str, list] = {"images": [], "videos": [], "audios": []}
    for item in items:
        if isinstance(item, str):
            content.append({"type": "text", "text": item})
            continue
        kind, key = next(v for cls, v in _ITEM_KINDS.items() if isinstance(item, cls))
        content.append({"type": kind})
        media[key].append(item)
    return content, media


# What the running call read of its original media (one list per tool thread: every call runs
# on a thread of its own, see toolbox._call); None outside a call, where looked_at does nothing.
_seen = threading.local()


def looked_at(media: str, path: str, **where: Any) -> None:
    """Say what of an original media item this call read, for the run's records and report:
    `media` "image" | "video" | "audio", `path` the file, and where in it -- `box` [x1, y1, x2, y2]
    in original pixels with `size` [w, h]; `span` [start, end] seconds with `duration` (and the
    returned frames' `timestamps`). Numpy values become numbers, anything else not JSON-able its
    str: the note goes into rollouts.jsonl as is. A user tool may call it too."""
    notes = getattr(_seen, "notes", None)
    if notes is not None:
        note = {"media": media, "path": str(path), **where}
        notes.append(json.loads(json.dumps(note, default=lambda v: v.tolist()
                                           if hasattr(v, "tolist") else str(v))))


def watching() -> list[dict]:
    """Start collecting this thread's looked_at notes; returns the list they go to."""
    _seen.notes = []
    return _seen.notes


def error_text(kind: str, message: str) -> str:
    """What the model reads when a call fails."""
    return f"Error ({kind}): {message}"


# Python annotation -> JSON-schema type, for specs derived from a user tool's signature.
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
               dict: "object", "int": "integer", "float": "number", "str": "string",
               "bool": "boolean", "list": "array", "dict": "object"}


def tool_spec(spec: dict) -> Callable[[Callable], Callable]:
    """Decorator: attach a function spec ({"description", "parameters"}: JSON schema) to a tool;
    without one, `spec_of` derives it from the signature and docstring."""
    def deco(fn: Callable) -> Callable:
        fn.tool_spec = spec
        return fn

    return deco


def model_parameters(fn: Callable) -> list[inspect.Parameter]:
    """The parameters a model may set: every one but `context` and keyword-only settings."""
    return [p for p in inspect.signature(fn).parameters.values()
            if p.name != "context" and p.kind is p.POSITIONAL_OR_KEYWORD]


def spec_of(fn: Callable, name: str) -> dict:
    """{"name", "description", "parameters"} of a tool: its `tool_spec`, or one derived from its
    signature (annotated types; parameters without a default are required) and docstring."""
    given = getattr(fn, "tool_spec", None)
    if given is not None:
        return {"name": name, **given}
    props, required = {}, []
    for p in model_parameters(fn):
        kind = _JSON_TYPES.get(p.annotation)
        props[p.name] = {"type": kind} if kind else {}
        if p.default is p.empty:
            required.append(p.name)
    doc = (inspect.getdoc(fn) or name).split("\n\n")[0].replace("\n", " ")
    return {"name": name, "description": doc,
            "parameters": {"type": "object", "properties": props, "required": required}}
