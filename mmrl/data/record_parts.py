"""The parts of an anchor project's record that every adapter in formats.py reads: question text,
media references (paths, HF/parquet bytes, PIL images), options and letters, number lists, the
image size of box answers, and the Sample they make up.

Embedded media are written once to a content-addressed folder: by default $MMRL_EMBEDDED_DIR (or
~/.cache/mmrl/embedded); `convert` points it at a folder next to its output with `embedding_into`.
Malformed parts raise RecordError naming file:line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mmrl.data.media_errors import RecordError
from mmrl.data.media_sources import embedded_dir, embedding_into, resolve  # noqa: F401
from mmrl.types import Sample

PLACEHOLDER = re.compile(r"<(image|video|audio)>")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
LETTER = re.compile(r"[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[.:]?")
# A Qwen processor's own media tokens: it writes (and counts media by) these itself, so in a
# record's text they break its media count deep inside the processor.
MODEL_TOKENS = re.compile(r"<\|(?:vision_start|vision_end|vision_pad|image_pad|video_pad|"
                          r"audio_bos|audio_eos|audio_start|audio_end|audio_pad|"
                          r"AUDIO|IMAGE|VIDEO)\|>")
OPTION_PREFIX = re.compile(r"\s*[\(\[]?([A-Z])[\)\].:]\s*")
BOX_KEY = re.compile(r"[\"'](?:Position|bbox_2d|bbox)[\"']\s*:\s*\[")  # Visual-RFT / Qwen JSON boxes
# Keys that load_media reads as decode overrides: an anchor's same-named column may mean something
# else, so it is renamed (source_<key>). Time-R1's video_start/video_end are kept on purpose by
# its adapter: they are the clip window, cut at decode time.
OVERRIDE_KEYS = {"video_start", "video_end", "fps", "nframes", "max_frames"}


def fail(source: str, msg: str) -> RecordError:
    return RecordError(f"{source}: {msg}")


def text_of(record: dict, keys: tuple[str, ...], source: str, what: str) -> str:
    for key in keys:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if value is not None and not isinstance(value, str):
            raise fail(source, f"{key!r} must be a string, got {type(value).__name__}")
    raise fail(source, f"missing {what} (one of {', '.join(map(repr, keys))})")


def media_ref(value: Any, base: Path, source: str, key: str) -> str:
    """One media item in any accepted form (a path, file:// or http(s) URL, data: URI, base64,
    {"bytes"|"path"}, an audio array, a PIL image) -> a local path (mmrl/data/media_sources.py)."""
    return resolve(value, base, source, key)


def media_refs(record: dict, keys: tuple[str, ...], base: Path, source: str) -> list[str]:
    for key in keys:
        value = record.get(key)
        if value is None or value == [] or value == "":
            continue
        items = value if isinstance(value, list) else [value]
        return [media_ref(v, base, source, key) for v in items]
    return []


def media_content(text: str, counts: dict[str, int], source: str) -> list[dict]:
    """Chat content with media items where the text has placeholders; the rest go first."""
    found = {kind: 0 for kind in ("image", "video", "audio")}
    parts: list[dict] = []
    pos = 0
    for m in PLACEHOLDER.finditer(text):
        if text[pos:m.start()].strip():
            parts.append({"type": "text", "text": text[pos:m.start()].strip()})
        parts.append({"type": m.group(1)})
        found[m.group(1)] += 1
        pos = m.end()
    if text[pos:].strip():
        parts.append({"type": "text", "text": text[pos:].strip()})
    lead = []
    for kind in ("image", "video", "audio"):
        n = counts.get(kind + "s", 0)
        if found[kind] > n:
            raise fail(source, f"the text has {found[kind]} <{kind}> placeholder(s) but the record "
                                f"lists {n} {kind}(s)")
        lead += [{"type": kind}] * (n - found[kind])
    if not any(p["type"] == "text" for p in parts):
        raise fail(source, "empty question text")
    return lead + parts


def with_hint(text: str, hint: str | None) -> str:
    if not hint or "<answer>" in text.lower():
        return text
    return f"{text.rstrip()}\n{hint}"


def unwrap(value: Any) -> Any:
    if isinstance(value, str):
        m = ANSWER_TAG.search(value)
        return (m.group(1) if m else value).strip()
    return value


def lettered_options(value: Any, source: str) -> list[str]:
    """Options as "A. text" lines (kept as they are when already lettered)."""
    if isinstance(value, dict):
        value = [f"{k}. {v}" for k, v in value.items()]
    if not isinstance(value, list) or not value or len(value) > 26:
        raise fail(source, f"options must be a non-empty list (<= 26), got {value!r:.80}")
    out = []
    for i, opt in enumerate(value):
        text = str(opt).strip()
        out.append(text if OPTION_PREFIX.match(text) else f"{chr(65 + i)}. {text}")
    return out


def _option_text(option: str) -> str:
    m = OPTION_PREFIX.match(option)
    return (option[m.end():] if m else option).strip().lower()


def answer_letter(answer: Any, options: list[str], source: str) -> str:
    """A multiple-choice answer -> letter: "B", "(b)", "B. cat", 1 (0-based index) or "cat"."""
    n = len(options)
    if isinstance(answer, bool):
        raise fail(source, f"multiple-choice answer must be a letter, index or option, got {answer}")
    if isinstance(answer, int):
        if not 0 <= answer < n:
            raise fail(source, f"answer index {answer} is outside the {n} options")
        return chr(65 + answer)
    text = str(unwrap(answer)).strip()
    m = LETTER.fullmatch(text) or OPTION_PREFIX.match(text)
    if m and m.group(1).upper() in [chr(65 + i) for i in range(n)]:
        return m.group(1).upper()
    for i, opt in enumerate(options):
        if text.lower() == _option_text(opt):
            return chr(65 + i)
    raise fail(source, f"answer {text!r:.40} is not a letter of, or one of, the {n} options")


def numbers(value: Any, n: int | None, source: str, what: str) -> list[float] | None:
    """A list of numbers from a list or its JSON/"a to b" text; None when it is not one."""
    if isinstance(value, str):
        text = unwrap(value)
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, ValueError):
            parts = re.split(r"\s*(?:to|,)\s*", text.strip("[]() "))
            try:
                value = [float(p) for p in parts if p]
            except ValueError:
                return None
    if (isinstance(value, list) and value and all(isinstance(v, (int, float))
                                                   and not isinstance(v, bool) for v in value)):
        if n is not None and len(value) != n:
            raise fail(source, f"{what} must have {n} numbers, got {value!r:.80}")
        # Whole numbers stay whole ("[4, 35, 22, 53]", as the anchors write pixel boxes): the
        # solution is also the SFT target, and "4.0" costs two tokens that say nothing.
        return [int(v) if float(v).is_integer() else float(v) for v in value]
    return None


def passthrough(record: dict, used: set[str]) -> dict:
    """The record's other JSON-safe columns as Sample.fields (override-like keys renamed)."""
    out = {}
    for key, value in record.items():
        if key in used or value is None:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # images / bytes in other columns: not fields
        out[f"source_{key}" if key in OVERRIDE_KEYS else key] = value
    return out


def make_sample(record: dict, source: str, *, text: str, media: dict[str, list[str]], solution: Any,
            task: str, fields: dict, id_keys: tuple[str, ...] = ("id",),
            record_task: bool = True) -> Sample:
    content = media_content(text, {k: len(v) for k, v in media.items()}, source)
    ident = next((record[k] for k in id_keys if record.get(k) not in (None, "")), source)
    return Sample(id=str(ident), messages=[{"role": "user", "content": content}],
                  solution=solution,
                  task=str((record.get("task") if record_task else None) or task),
                  images=media.get("images", []), videos=media.get("videos", []),
                  audios=media.get("audios", []), fields=fields, source=source)


def image_size(path: str) -> list[int] | None:
    """[width, height] as `load_image` will see it (EXIF rotation applied), from the file header
    only; None when the file does not open (inspect and training report that file themselves)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            w, h = im.size
            if im.getexif().get(0x0112) in (5, 6, 7, 8):  # rotated by 90 degrees on load
                w, h = h, w
            return [int(w), int(h)]
    except Exception:  # noqa: BLE001 - PIL raises many types; a bad file is reported elsewhere
        return None


def with_image_size(fields: dict, solution: Any, images: list[str]) -> dict:
    """Box answers need the image size to map model coordinates (iou coords=qwen2_5_vl ...)."""
    if is_boxes(solution) and len(images) == 1 and "image_size" not in fields:
        size = image_size(images[0])
        if size is not None:
            fields["image_size"] = size
    return fields


def is_boxes(solution: Any) -> bool:
    if isinstance(solution, list):
        return len(solution) == 4 or any(isinstance(b, (list, dict)) for b in solution)
    return isinstance(solution, str) and bool(BOX_KEY.search(solution))


def check_dict(record: Any, source: str) -> dict:
    if not isinstance(record, dict):
        raise fail(source, f"a record must be a JSON object, got {type(record).__name__}")
    return record


def check_model_tokens(sample: Sample) -> None:
    """RecordError naming a Qwen media token written in a sample's text (MODEL_TOKENS)."""
    for m in sample.messages:
        content = m.get("content")
        texts = [content] if isinstance(content, str) else [
            p.get("text", "") for p in content or [] if isinstance(p, dict)]
        for text in texts:
            found = MODEL_TOKENS.search(text or "")
            if found:
                raise fail(sample.source, f"the {m.get('role')} text holds {found.group(0)}, a "
                                          f"token the model's processor writes itself for each "
                                          f"media item: written in a record it breaks the media "
                                          f"count. Write <image>, <video> or <audio> where the "
                                          f"item goes instead (the whole "
                                          f"<|vision_start|>...<|vision_end|> span)")
