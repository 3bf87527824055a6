"""Prompt templates: the anchors' instructions (think / no-think, answer format) by name.

`data.prompt_template` names one of `TEMPLATES` or is a custom string with `{question}` (and any
sample field, e.g. `{duration}`). It is applied once, when the data is loaded, so rollout, SFT and
eval all see the same prompt. `{question}` is the record's question with the adapters' own answer
hint ("Answer with the option letter in <answer></answer>.") removed, since every template states
its answer format. `{type_hint}` is Video-R1's per-problem-type answer format.

The wording follows each anchor's training template; `*_nothink` variants drop the think request
(use them with `format` think=false/optional, or rewards that do not score <think>).
"""
from __future__ import annotations

import dataclasses
import string
from typing import Any

from mmrl.config import clip

from mmrl.data.formats import HINTS, TIME_HINT
from mmrl.types import Sample

_THINK = "Output the thinking process in <think> </think> and the final answer in <answer> </answer> tags."
_ANSWER = "Output the final answer in <answer> </answer> tags."
TEMPLATES: dict[str, str] = {
    # om-ai-lab/VLM-R1 (REC and open tasks)
    "vlm_r1": "{question} First output the thinking process in <think> </think> tags and then "
              "output the final answer in <answer> </answer> tags.",
    "vlm_r1_nothink": "{question} " + _ANSWER,
    # Deep-Agent/R1-V and Liuziyu77/Visual-RFT
    "r1v": "{question} " + _THINK,
    "r1v_nothink": "{question} " + _ANSWER,
    # tulerfeng/Video-R1: deliberate thinking, then the problem type's answer format
    "video_r1": "{question}\nPlease think about this question as if you were a human pondering "
                "deeply, with self-reflection and verification. Provide your detailed reasoning "
                "between the <think> </think> tags, and then give your final answer between the "
                "<answer> </answer> tags.{type_hint}",
    "video_r1_nothink": "{question}\nGive your final answer between the <answer> </answer> "
                        "tags.{type_hint}",
    # xiaomi-research/r1-aqa (the question already lists the options)
    "r1_aqa": "{question}\n" + _THINK,
    "r1_aqa_nothink": "{question}\n" + _ANSWER,
    # Time-R1: think, then "start to end" in seconds
    "time_r1": "{question} Output your thought process within the <think> </think> tags, then "
               "provide the start and end times in seconds, precise to two decimal places, as "
               "\"start time to end time\" within the <answer> </answer> tags, e.g. "
               "\"12.54 to 17.83\".",
    "time_r1_nothink": "{question} Provide the start and end times in seconds, precise to two "
                       "decimal places, as \"start time to end time\" within the <answer> "
                       "</answer> tags, e.g. \"12.54 to 17.83\".",
    # generic
    "think": "{question}\nThink step by step inside <think> </think> tags, then give the final "
             "answer inside <answer> </answer> tags.",
    "answer": "{question}\nGive the final answer inside <answer> </answer> tags.",
}
TYPE_HINTS = {
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) "
                       "within the <answer> </answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> "
                 "</answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text answer "
           "within the <answer> </answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> "
                  "</answer> tags.",
}
_STRIP = sorted([*HINTS.values(), TIME_HINT], key=len, reverse=True)


def resolve(template: str) -> str:
    """A template name or a custom string -> the format string; errors name the choices."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if "{question}" not in template:
        raise ValueError(f"data.prompt_template: {clip(repr(template))} is neither a template name "
                         f"({', '.join(TEMPLATES)}) nor a string containing {{question}}")
    return template


def _question(text: str) -> str:
    text = text.rstrip()
    for hint in _STRIP:
        if text.endswith(hint):
            return text[:-len(hint)].rstrip()
    return text


def last_user(sample: Sample, what: str) -> tuple[list[dict], dict]:
    """(a copy of the messages, its last user message) to rewrite for `what` (a config key)."""
    messages = [dict(m) for m in sample.messages]
    user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if user is None:
        raise ValueError(f"{sample.source}: no user message to apply {what} to")
    return messages, user


def apply_template(sample: Sample, template: str) -> Sample:
    """The sample with its last user text part rewritten through `template` (a copy)."""
    fmt = resolve(template)
    messages, user = last_user(sample, "data.prompt_template")
    content = user["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    content = [dict(c) for c in content]
    idx = max((i for i, c in enumerate(content) if c.get("type") == "text"), default=None)
    if idx is None:
        raise ValueError(f"{sample.source}: no question text to apply data.prompt_template to")
    values: dict[str, Any] = {**sample.fields, "question": _question(content[idx]["text"]),
                              "type_hint": TYPE_HINTS.get(sample.fields.get("problem_type"), "")}
    try:
        content[idx]["text"] = string.Formatter().vformat(fmt, (), values)
    except KeyError as e:
        raise ValueError(f"{sample.source}: data.prompt_template uses {{{e.args[0]}}}, which "
                         f"this record does not have") from None
    user["content"] = content
    return dataclasses.replace(sample, messages=messages)
