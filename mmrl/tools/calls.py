"""Tool calls out of a model turn's text, and whether the turn ends the trajectory.

Three call formats (`tools.call_format`):

- "qwen": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn: what
  Qwen2.5 / Qwen3(-VL) chat templates teach from `tools` (mmrl/tools/prompt.py writes the same
  instructions for templates that do not render them).
- "json_box": MGPO's grounding turn, a bare JSON object `{"bbox_2d": [x1, y1, x2, y2]}` (also in
  a ```json fence, or a one-element list of it), answered by the `crop` tool.
- "json_span": its time counterpart, `{"span": [start, end]}` in seconds, answered by `frames`.

A turn holding an `<answer>...</answer>` block is final, calls or not; so is a turn with neither
a call nor an answer (the model stopped: rewards score what it wrote). A call that cannot be read
is still a call: it comes back as an error observation of kind "malformed", never silently
dropped. Scanning uses `str.find`, so hostile text stays linear-time.

>>> parse_turn('<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 30, 40]}}</tool_call>', "qwen").calls
[ToolCall(name='crop', arguments={'bbox_2d': [1, 2, 30, 40]}, error=None, detail='')]
>>> parse_turn("<think>ok</think><answer>B</answer>", "qwen").final
True
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rewards.core import ANSWER_CLOSE, ANSWER_OPEN

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
BOX_KEY, SPAN_KEY = "bbox_2d", "span"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # "malformed" when the call could not be read
    detail: str = ""  # what was wrong, for the error observation


@dataclass(frozen=True)
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    final: bool = False  # ends the trajectory


def has_answer(text: str) -> bool:
    """An `<answer>` block that opens and closes."""
    start = text.find(ANSWER_OPEN)
    return start >= 0 and text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN)) >= 0


def _malformed(detail: str) -> ToolCall:
    return ToolCall(name="", arguments={}, error="malformed", detail=detail)


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def call_from_json(body: str) -> ToolCall:
    """One `{"name": ..., "arguments": {...}}` object -> ToolCall (malformed ones included).
    `arguments` may arrive as a JSON string (some models write it so)."""
    value = _load(body.strip())
    if not isinstance(value, dict):
        return _malformed(f"not a JSON object: {body.strip()[:120]!r}")
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name:
        return _malformed('the call names no tool (expected {"name": ..., "arguments": {...}})')
    if isinstance(arguments, str):
        arguments = _load(arguments)
    if not isinstance(arguments, dict):
        return _malformed(f"arguments of {name!r} must be a JSON object")
    return ToolCall(name=name, arguments=arguments)


def parse_qwen(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` block; an opened block that never closes is one
    malformed call (a turn cut inside its call, or a broken tag)."""
    calls, pos = [], 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            return calls
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            return calls + [_malformed(f"{CALL_OPEN} without {CALL_CLOSE}")]
        calls.append(call_from_json(text[start + len(CALL_OPEN):end]))
        pos = end + len(CALL_CLOSE)


def _bare_object(text: str, key: str) -> tuple[bool, Any]:
    """(whether `text` names "key", the first JSON object around it holding `key`, or None)."""
    at = text.find(f'"{key}"')
    if at < 0:
        return False, None
    start, end = text.rfind("{", 0, at), text.find("}", at)
    value = _load(text[start:end + 1]) if start >= 0 and end >= 0 else None
    return True, value if isinstance(value, dict) and key in value else None


def parse_json_box(text: str, tool: str = "crop") -> list[ToolCall]:
    """MGPO's grounding turn: the first JSON object holding "bbox_2d" becomes one `tool` call
    with that object as its arguments. Text that names "bbox_2d" without a readable object is a
    malformed call; text without it holds no call."""
    named, value = _bare_object(text, BOX_KEY)
    if not named:
        return []
    if value is None:
        return [_malformed(f'no readable {{"{BOX_KEY}": [x1, y1, x2, y2]}} object')]
    return [ToolCall(name=tool, arguments=value)]


def parse_json_span(text: str, tool: str = "frames") -> list[ToolCall]:
    """The time counterpart of json_box: the first JSON object holding "span" ([start, end] in
    seconds) becomes one `tool` call with arguments {"start", "end"} (and the object's other
    keys), a quarter of the `<tool_call>` form's tokens. Malformed as json_box's.

    >>> parse_json_span('{"span": [2, 5.5]}')
    [ToolCall(name='frames', arguments={'start': 2, 'end': 5.5}, error=None, detail='')]
    >>> parse_json_span('{"span": [2]}')[0].error
    'malformed'
    """
    named, value = _bare_object(text, SPAN_KEY)
    if not named:
        return []
    span = value.get(SPAN_KEY) if value is not None else None
    if not isinstance(span, list) or len(span) != 2:
        return [_malformed(f'no readable {{"{SPAN_KEY}": [start, end]}} object (seconds)')]
    rest = {k: v for k, v in value.items() if k != SPAN_KEY}
    return [ToolCall(name=tool, arguments={**rest, "start": span[0], "end": span[1]})]


# The parser per tools.call_format.
CALL_FORMATS = {"qwen": parse_qwen, "json_box": parse_json_box, "json_span": parse_json_span}


def parse_turn(text: str, call_format: str) -> ParsedTurn:
    """The calls of one model turn and whether it ends the trajectory (see the module doc)."""
    if has_answer(text):
        return ParsedTurn(calls=[], final=True)
    calls = CALL_FORMATS[call_format](text)
    return ParsedTurn(calls=calls, final=not calls)
