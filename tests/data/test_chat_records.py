"""Chat records (LLaMA-Factory / ShareGPT `messages` + `images`, `conversations` from/value):
placeholders become media parts in order, the last assistant turn is the answer and never the
prompt, and a prompt holding its own answer is warned about."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from mmrl import config
from mmrl.data.chat import answer_in_prompt
from mmrl.data.inspect import inspect_file
from mmrl.data.prepare import build_datasets, check_datasets
from mmrl.data.schema import FORMATS, RecordError, load_samples


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _types(message):
    return [p["type"] for p in message["content"]]


@pytest.fixture
def images(tmp_path):
    for name in ("a.png", "b.png"):
        Image.new("RGB", (32, 32)).save(tmp_path / name)
    return tmp_path


def test_llama_factory_string_content_with_placeholders(images):
    """LLaMA-Factory's sharegpt layout in OpenAI roles: no `solution` field."""
    path = _jsonl(images / "d.jsonl", [{
        "messages": [{"role": "system", "content": "You count."},
                     {"role": "user", "content": "<image>How many? Compare with <image>."},
                     {"role": "assistant", "content": "<answer>5</answer>"}],
        "images": ["a.png", "b.png"]}])
    (s,) = load_samples(path)
    assert s.solution == "5" and [m["role"] for m in s.messages] == ["system", "user"]
    assert _types(s.messages[1]) == ["image", "text", "image", "text"]
    assert s.images == [str(images / "a.png"), str(images / "b.png")]
    report = inspect_file(path)
    assert report["format"] == "mmrl" and report["bad_records"] == report["bad_media"] == []


def test_list_content_with_the_answer_turn_kept_never_trains_on_the_answer(images):
    path = _jsonl(images / "d.jsonl", [{
        "messages": [{"role": "user", "content": [{"type": "image"},
                                                  {"type": "text", "text": "How many?"}]},
                     {"role": "assistant", "content": [{"type": "text",
                                                        "text": "<answer>5</answer>"}]}],
        "images": ["a.png"], "solution": "5"}])
    (s,) = load_samples(path)
    assert [m["role"] for m in s.messages] == ["user"]
    assert "<answer>5</answer>" not in json.dumps(s.messages)
    assert not answer_in_prompt(s.messages, s.solution)


def test_sharegpt_conversations_keep_earlier_turns_and_media_parts_carry_paths(images):
    record = {"conversations": [
        {"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "A square."},
        {"from": "human", "value": "How many?"}, {"from": "gpt", "value": "3"}],
        "images": ["a.png"]}
    s = FORMATS.get("sharegpt")(record, "x.jsonl:1", images)
    assert s.solution == "3" and [m["role"] for m in s.messages] == ["user", "assistant", "user"]
    hf = {"messages": [{"role": "user", "content": [{"type": "image", "image": "b.png"},
                                                    {"type": "text", "text": "Q?"}]},
                       {"role": "assistant", "content": "B"}]}
    s = FORMATS.get("mmrl")(hf, "x.jsonl:2", images)
    assert s.images == [str(images / "b.png")] and s.messages[0]["content"][0] == {"type": "image"}


def test_more_placeholders_than_media_is_an_error_naming_the_record(images):
    bad = {"messages": [{"role": "user", "content": "<image><image>Q?"},
                        {"role": "assistant", "content": "1"}], "images": ["a.png"]}
    with pytest.raises(RecordError, match=r"x.jsonl:1: the messages mark 2 image"):
        FORMATS.get("mmrl")(bad, "x.jsonl:1", images)
    with pytest.raises(RecordError, match="last assistant turn"):
        FORMATS.get("mmrl")({"messages": [{"role": "user", "content": "Q?"}]}, "x.jsonl:2",
                            images)


def test_a_prompt_holding_its_own_answer_is_warned_about_with_a_count(images):
    rows = [{"messages": [{"role": "user", "content": f"<image>How many? <answer>{i}</answer>"},
                          {"role": "assistant", "content": str(i)}], "images": ["a.png"]}
            for i in range(3)]
    rows.append({"prompt": "How many?", "images": ["a.png"], "solution": "7"})
    path = _jsonl(images / "d.jsonl", rows)
    cfg = config.load(None, [f"data.train={path}", "rewards=[{name: accuracy}]"])
    train, _ = build_datasets(cfg, 28)
    (warning,) = check_datasets(cfg, train, None)
    assert warning.startswith("3 of 4 records checked hold their own answer in the prompt")
    assert f"{path}:1" in warning


def test_media_parts_and_a_media_list_naming_different_items_is_an_error(images):
    """One of the two would be dropped without a word; the same items twice is one source."""
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": "b.png"},
                                                        {"type": "text", "text": "Q?"}]},
                           {"role": "assistant", "content": "1"}], "images": ["a.png"]}
    with pytest.raises(RecordError, match=r"^x.jsonl:3: the messages' image parts name 1 "
                                          r"image\(s\) and 'images' lists 1 others; keep one"):
        FORMATS.get("mmrl")(record, "x.jsonl:3", images)
    same = {**record, "images": ["b.png"]}
    assert FORMATS.get("mmrl")(same, "x.jsonl:3", images).images == [str(images / "b.png")]
