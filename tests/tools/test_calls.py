"""Tool calls out of a model turn: Qwen's <tool_call> form and MGPO's bare JSON box, final
answers, and every malformed call kept as a call (its error goes back to the model)."""
from __future__ import annotations

from mmrl.tools import parse_turn
from mmrl.tools.calls import ToolCall


def calls(text: str, fmt: str = "qwen") -> list[ToolCall]:
    parsed = parse_turn(text, fmt)
    assert not parsed.final
    return parsed.calls


def test_qwen_calls_in_order_with_string_arguments():
    text = ('I will zoom.\n<tool_call>\n{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}\n'
            '</tool_call>\n<tool_call>{"name": "frames", "arguments": "{\\"start\\": 1, \\"end\\": 2}"}'
            '</tool_call>')
    assert calls(text) == [ToolCall("crop", {"bbox_2d": [1, 2, 3, 4]}),
                           ToolCall("frames", {"start": 1, "end": 2})]


def test_malformed_qwen_calls_are_calls_with_an_error():
    cases = {
        '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2</tool_call>': "not a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "names no tool",
        '<tool_call>{"name": "crop", "arguments": [1, 2]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "crop", "arguments": {}}': "without </tool_call>",
    }
    for text, detail in cases.items():
        (call,) = calls(text)
        assert call.error == "malformed" and detail in call.detail, (text, call)


def test_an_answer_ends_the_trajectory_and_so_does_a_turn_without_a_call():
    answer = parse_turn('<tool_call>{"name": "crop", "arguments": {}}</tool_call><answer>B</answer>',
                        "qwen")
    assert answer.final and answer.calls == []
    assert parse_turn("I think it is red.", "qwen").final
    # An answer tag that never closes is no answer: the call still runs.
    assert calls('<answer>B <tool_call>{"name": "crop", "arguments": {}}</tool_call>') == [
        ToolCall("crop", {})]


def test_json_box_format_is_a_crop_call():
    assert calls('Look here: {"bbox_2d": [10, 20, 30, 40]}', "json_box") == [
        ToolCall("crop", {"bbox_2d": [10, 20, 30, 40]})]
    fenced = '```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "sign"}]\n```'
    assert calls(fenced, "json_box") == [ToolCall("crop", {"bbox_2d": [1, 2, 3, 4], "label": "sign"})]
    (bad,) = calls('{"bbox_2d": [1, 2', "json_box")
    assert bad.error == "malformed"
    assert parse_turn("<answer>A</answer>", "json_box").final
    assert parse_turn("no box here", "json_box").final


def test_json_span_format_is_a_frames_call():
    assert calls('Again: {"span": [2, 5.5]}', "json_span") == [
        ToolCall("frames", {"start": 2, "end": 5.5})]
    assert calls('```json\n{"span": [0, 1], "video": 2}\n```', "json_span") == [
        ToolCall("frames", {"video": 2, "start": 0, "end": 1})]
    for bad in ('{"span": [1, 2', '{"span": 3}', '{"span": [1, 2, 3]}'):
        (call,) = calls(bad, "json_span")
        assert call.error == "malformed" and '{"span": [start, end]}' in call.detail, bad
    assert parse_turn("<answer>A</answer>", "json_span").final
    assert parse_turn('no span here, a box {"bbox_2d": [1, 2, 3, 4]}', "json_span").final


def test_parsing_hostile_text_stays_linear():
    import time

    text = "<tool_call>" * 20000 + "{" * 20000
    start = time.monotonic()
    (call,) = calls(text)
    assert call.error == "malformed" and time.monotonic() - start < 1.0
