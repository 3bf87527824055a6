"""Chat records -> the prompt messages and the gold answer: `messages` (role / content, as
LLaMA-Factory, OpenAI-style and HF chat data have them) and ShareGPT `conversations` (from /
value).

- Content is a string or a list of parts; `<image>`, `<video>` and `<audio>` placeholders in the
  text are matched in order to the record's `images` / `videos` / `audios` lists (items left
  without a placeholder go first in the first user turn, as in the anchors' adapters; more
  placeholders than items is an error). Media parts ({"type": "image"}) count the same way; a
  part may carry its own path ({"type": "image", "image": "a.png"}) when the record lists none.
- The last assistant turn is the gold answer (its `<answer>` block when it has one) and never
  enters the prompt; a `solution` field, when present, is the answer instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.data.media_errors import RecordError
from mmrl.data.record_parts import ANSWER_TAG, PLACEHOLDER, media_ref, unwrap

KINDS = ("image", "video", "audio")
URL_PARTS = {"image_url": "image", "video_url": "video", "audio_url": "audio",
             "input_audio": "audio"}
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "model": "assistant", "bot": "assistant", "system": "system"}


def read_chat(record: dict, source: str, base: Path,
              media: dict[str, list[str]]) -> tuple[list[dict], Any, dict[str, list[str]]]:
    """(prompt messages, the last assistant turn's answer or None, media lists) of a record with
    `messages` or `conversations`; `media` holds the paths the record lists (may gain paths
    carried by media parts)."""
    turns = record.get("messages") or record.get("conversations")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise RecordError(f"{source}: 'messages' must be a non-empty list of {{role, content}} "
                          f"objects")
    messages = [_message(t, i, source) for i, t in enumerate(turns)]
    answer = None
    if messages[-1]["role"] == "assistant":
        last = messages.pop()
        text = "".join(p.get("text", "") for p in last["content"] if p["type"] == "text")
        answer = unwrap(text) if text.strip() else None
    if not any(m["role"] == "user" for m in messages):
        raise RecordError(f"{source}: no user turn in 'messages' before the answer")
    media = {k: list(v) for k, v in media.items()}
    for kind in KINDS:
        carried = [media_ref(p.get(kind) or p.get("path") or p.get("url"), base, source, kind)
                   for m in messages for p in m["content"]
                   if p["type"] == kind and (p.get(kind) or p.get("path") or p.get("url"))]
        listed = media.get(kind + "s")
        if carried and listed and carried != listed:  # two sources: one would be dropped
            raise RecordError(f"{source}: the messages' {kind} parts name {len(carried)} "
                              f"{kind}(s) and '{kind}s' lists {len(listed)} others; keep one")
        if carried:
            media[kind + "s"] = carried
    _place_media(messages, {k: len(media.get(k + "s", [])) for k in KINDS}, source)
    return messages, answer, media


def _message(turn: dict, i: int, source: str) -> dict:
    role = turn.get("role", turn.get("from"))
    if role not in ROLES:
        raise RecordError(f"{source}: message {i} has role {role!r}; expected one of "
                          f"{sorted(set(ROLES))}")
    content = turn.get("content", turn.get("value"))
    if isinstance(content, str):
        parts = _split(content)
    elif isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = []
        for p in content:
            kind = p.get("type")
            if kind == "text" and isinstance(p.get("text"), str):
                parts += _split(p["text"])
            elif kind in KINDS:
                parts.append({k: v for k, v in p.items() if v is not None})  # HF rows: None keys
            elif kind in URL_PARTS:  # OpenAI style: image_url {"url": ...}, input_audio {"data"}
                parts.append(_url_part(p, kind))
            else:
                raise RecordError(f"{source}: message {i} has a content part of type {kind!r}; "
                                  f"expected text, image, video, audio or one of "
                                  f"{sorted(URL_PARTS)}")
    else:
        raise RecordError(f"{source}: message {i} content must be a string or a list of parts")
    return {"role": ROLES[role], "content": parts}


def _url_part(part: dict, kind: str) -> dict:
    """An OpenAI-style media part as {"type": image|video|audio, "path": reference}."""
    value = part.get(kind)
    if kind == "input_audio" and isinstance(value, dict) and value.get("data"):
        return {"type": "audio",
                "path": f"data:audio/{value.get('format') or 'wav'};base64,{value['data']}"}
    return {"type": URL_PARTS[kind], "path": value.get("url") if isinstance(value, dict) else value}


def _split(text: str) -> list[dict]:
    """Text with placeholders -> text and media parts in order."""
    parts, pos = [], 0
    for m in PLACEHOLDER.finditer(text):
        if text[pos:m.start()].strip():
            parts.append({"type": "text", "text": text[pos:m.start()].strip()})
        parts.append({"type": m.group(1)})
        pos = m.end()
    if text[pos:].strip():
        parts.append({"type": "text", "text": text[pos:].strip()})
    return parts


def _place_media(messages: list[dict], counts: dict[str, int], source: str) -> None:
    """Strip paths from media parts (the Sample's lists hold them) and put items that no part
    marks at the start of the first user turn; more marks than items is an error."""
    for m in messages:
        m["content"] = [{"type": p["type"]} if p["type"] in KINDS else p for p in m["content"]]
    first_user = next(m for m in messages if m["role"] == "user")
    for kind in reversed(KINDS):
        marked = sum(p["type"] == kind for m in messages for p in m["content"])
        if marked > counts[kind]:
            raise RecordError(f"{source}: the messages mark {marked} {kind}(s) (<{kind}> or "
                              f"{{\"type\": \"{kind}\"}}) but the record lists {counts[kind]} in "
                              f"'{kind}s'")
        first_user["content"][:0] = [{"type": kind}] * (counts[kind] - marked)
    if not any(p["type"] == "text" for m in messages for p in m["content"]):
        raise RecordError(f"{source}: the messages hold no question text")


def answer_in_prompt(messages: list[dict], solution: Any) -> bool:
    """Whether the prompt already holds its own gold answer: an `<answer>` block or an assistant
    turn that says it (a chat whose answer turn was kept trains on a prompt ending with it)."""
    gold = " ".join(str(unwrap(solution) if isinstance(solution, str) else solution).split())
    if not gold:
        return False
    for m in messages:
        content = m.get("content")
        texts = [content] if isinstance(content, str) else [
            p.get("text", "") for p in content or [] if isinstance(p, dict)
            and p.get("type") == "text"]
        for text in texts:
            said = [" ".join(a.split()) for a in ANSWER_TAG.findall(text)]
            if m.get("role") == "assistant":
                said.append(" ".join(str(unwrap(text)).split()))
            if gold in said:
                return True
    return False
