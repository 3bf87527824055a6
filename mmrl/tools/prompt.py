"""Telling the model about its tools.

With the "qwen" call format, a chat template that renders `tools` (Qwen3-VL's) gets the function
specs and writes its own instructions. Templates that ignore `tools` (Qwen2.5-VL's processor
template, the tiny models') get the same instructions in the system message, in the words Qwen's
tool templates use, so the model reads what its family was trained on. The "json_box" format
(MGPO) has no function specs: a short instruction says how to ask for a region; "json_span",
its time counterpart, how to ask for a span of the video.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from mmrl.types import Sample

_PROBE_SPEC = {"type": "function", "function": {
    "name": "mmrl_probe", "description": "", "parameters": {"type": "object", "properties": {}}}}


def template_renders_tools(processor) -> bool:
    """Whether the chat template writes the `tools` it is given (a rendering probe)."""
    messages = [{"role": "user", "content": "x"}]
    plain = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with_tools = processor.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True, tools=[_PROBE_SPEC])
    return plain != with_tools


def qwen_instructions(specs: Sequence[dict]) -> str:
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in specs)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def box_instructions(specs: Sequence[dict]) -> str:
    return ('To look closer at a region of the image, output only its box as JSON, '
            '{"bbox_2d": [x1, y1, x2, y2]}: the region comes back as a new image. Give the final '
            'answer inside <answer> </answer>.')


def span_instructions(specs: Sequence[dict]) -> str:
    return ('To look again at a time span of the video, output only the span in seconds as '
            'JSON, {"span": [start, end]}: its frames come back at a higher frame rate. Give the '
            'final answer inside <answer> </answer>.')


# Per tools.call_format: the instruction text, and whether a template's own `tools` rendering
# (when it has one) replaces it.
INSTRUCTIONS = {"qwen": (qwen_instructions, True), "json_box": (box_instructions, False),
                "json_span": (span_instructions, False)}


def add_tool_prompt(sample: Sample, specs: Sequence[dict], processor, call_format: str,
                    instructions: str | None = None) -> tuple[Sample, list[dict] | None]:
    """(the sample as the model sees it with tools, the `tools` argument for the chat template):
    the specs go to a template that renders them, else the instructions (`instructions` when
    given, tools.instructions, always) are appended to the system message (one is added when the
    sample has none). No specs, or `instructions` "" (a model trained on its call format needs
    none): the sample unchanged."""
    if not specs or instructions == "":
        return sample, None
    write, template_may = INSTRUCTIONS[call_format]
    if instructions is None and template_may and template_renders_tools(processor):
        return sample, list(specs)
    text = write(specs) if instructions is None else instructions
    messages = [dict(m) for m in sample.messages]
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content")
        if isinstance(content, list):
            messages[0]["content"] = [*content, {"type": "text", "text": "\n\n" + text}]
        else:
            messages[0]["content"] = f"{content or ''}\n\n{text}".lstrip("\n")
    else:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": text}]})
    return dataclasses.replace(sample, messages=messages), None


def tool_prompt(sample: Sample, toolbox, processor,
                call_format: str) -> tuple[Sample, list[dict] | None]:
    """`add_tool_prompt` with the tools `sample` is offered (its record's "tools", else all of
    `toolbox`): what training, evaluation and the SFT warm-up all show the model."""
    return add_tool_prompt(sample, toolbox.specs(toolbox.offered(sample)), processor, call_format,
                           toolbox.instructions)
