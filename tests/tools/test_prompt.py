"""The model learns about its tools from its own template when that renders `tools`, else from
Qwen's tool instructions in the system message; the prompt the processor builds holds them."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl.models import get_adapter
from mmrl.models.tiny_tokenizer import CHAT_TEMPLATE
from mmrl.tools import Toolbox, add_tool_prompt, load_tool
from mmrl.tools.prompt import template_renders_tools
from mmrl.types import Sample

# The tiny template with a Qwen3-style tools header (what real Qwen3-VL templates do).
TOOLS_TEMPLATE = ("{%- if tools -%}<|im_start|>system{{ '\\n' }}# Tools{%- for t in tools -%}"
                  "{{ '\\n' }}{{ t | tojson }}{%- endfor -%}<|im_end|>{{ '\\n' }}{%- endif -%}"
                  + CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def tiny():
    adapter = get_adapter("qwen2_5_vl")
    return adapter, adapter.tiny()[1]


def sample(system: str | None = None) -> Sample:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return Sample(id="s", messages=messages, source="t.jsonl:1")


def test_templates_without_tools_get_qwen_instructions_in_the_system_message(tiny):
    adapter, processor = tiny
    specs = Toolbox([load_tool("crop")]).specs(["crop"])
    assert not template_renders_tools(processor)
    with_tools, chat_tools = add_tool_prompt(sample("Be brief."), specs, processor, "qwen")
    assert chat_tools is None
    system = with_tools.messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools\n")
    assert json.dumps(specs[0]) in system and '<tool_call>\n{"name": <function-name>' in system
    fresh, _ = add_tool_prompt(sample(), specs, processor, "qwen")
    assert fresh.messages[0]["role"] == "system" and len(fresh.messages) == 2
    features = adapter.prompt_features(processor, with_tools, [Image.new("RGB", (56, 56))])
    text = processor.tokenizer.decode(features.input_ids)
    assert '"name": "crop"' in text and "Q?" in text


def test_a_template_that_renders_tools_gets_the_specs(tiny):
    adapter, processor = tiny
    processor.chat_template = TOOLS_TEMPLATE
    try:
        specs = Toolbox([load_tool("crop")]).specs(["crop"])
        plain, chat_tools = add_tool_prompt(sample(), specs, processor, "qwen")
        assert chat_tools == specs and plain.messages == sample().messages
        features = adapter.prompt_features(processor, plain, [Image.new("RGB", (56, 56))],
                                           tools=chat_tools)
        assert '# Tools\n{"type": "function"' in processor.tokenizer.decode(features.input_ids)
        # The box format has no specs to render: its instruction goes to the system message.
        boxed, none = add_tool_prompt(sample(), specs, processor, "json_box")
        assert none is None and '{"bbox_2d": [x1, y1, x2, y2]}' in boxed.messages[0]["content"][0]["text"]
        spanned, none = add_tool_prompt(sample(), Toolbox([load_tool("frames")]).specs(
            ["frames"]), processor, "json_span")
        assert none is None and '{"span": [start, end]}' in spanned.messages[0]["content"][0]["text"]
    finally:
        processor.chat_template = CHAT_TEMPLATE


def test_no_tools_leaves_the_sample_alone(tiny):
    s = sample()
    assert add_tool_prompt(s, [], tiny[1], "qwen") == (s, None)


def test_tools_instructions_replace_the_built_in_ones_and_the_templates(tiny):
    """tools.instructions (a paper's own tool prompt) is what every path shows: the prompt
    features of training and evaluation, through tool_prompt and the run's Toolbox."""
    from mmrl import config
    from mmrl.tools import tool_prompt

    adapter, processor = tiny
    cfg = config.load("recipes/visual_search/config.yaml",
                      ["tools.call_format=json_box", "tools.instructions='Zoom: {\"bbox_2d\": "
                       "[x1, y1, x2, y2]}. Answer: <answer>X</answer>.'"])
    box = Toolbox.from_config(cfg.tools)
    mine, chat_tools = tool_prompt(sample("Be brief."), box, processor, "json_box")
    assert chat_tools is None
    assert mine.messages[0]["content"] == ('Be brief.\n\nZoom: {"bbox_2d": [x1, y1, x2, y2]}. '
                                           'Answer: <answer>X</answer>.')
    processor.chat_template = TOOLS_TEMPLATE  # a template that would render `tools` itself
    try:
        qwen, chat_tools = add_tool_prompt(sample(), box.specs(["crop"]), processor, "qwen",
                                           "Call crop.")
        assert chat_tools is None and qwen.messages[0]["content"][0]["text"] == "Call crop."
    finally:
        processor.chat_template = CHAT_TEMPLATE


def test_empty_instructions_add_nothing_even_where_the_template_renders_tools(tiny):
    """tools.instructions "" (a model trained on its call format, or a tiny one that reads no
    English): no system message, no `tools` block; the call still parses (the call format is
    the parser's, not the prompt's)."""
    adapter, processor = tiny
    specs = Toolbox([load_tool("crop")]).specs(["crop"])
    s = sample()
    assert add_tool_prompt(s, specs, processor, "json_box", "") == (s, None)
    processor.chat_template = TOOLS_TEMPLATE
    try:
        assert add_tool_prompt(s, specs, processor, "qwen", "") == (s, None)
    finally:
        processor.chat_template = CHAT_TEMPLATE
