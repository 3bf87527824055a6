"""User tools ("pkg.mod:fn") and the runner: what a tool may return, settings vs arguments,
and every failure -- unknown tool, bad arguments, an exception, a timeout, a result the model
cannot be shown -- an error outcome of its own kind, never a crash; calls run concurrently."""
from __future__ import annotations

import textwrap
import time

import numpy as np
import pytest
from PIL import Image

from mmrl.tools import Toolbox, as_content, load_tool, trajectory_metrics
from mmrl.tools.calls import ToolCall
from mmrl.types import PromptFeatures, Sample, ToolCallRecord, Trajectory

USER_TOOLS = '''
import time
import numpy as np
from PIL import Image
from mmrl.data.media import Video

def describe(word: str, times: int = 1, *, suffix: str = "!"):
    """Repeat a word.

    More text that is not the description."""
    return (word + suffix) * times

def picture(side: int):
    return Image.new("RGB", (side, side), "blue")

def clip(n: int):
    frames = np.zeros((n, 28, 28, 3), np.uint8)
    return [Video(frames=frames, fps=2.0, timestamps=[i / 2 for i in range(n)], duration=n / 2),
            "two frames"]

def tone(seconds: float):
    return np.zeros(int(16000 * seconds), np.float32)

def boom():
    raise RuntimeError("disk on fire")

def slow(seconds: float):
    time.sleep(seconds)
    return "done"

def bare_frames():
    return np.zeros((2, 28, 28, 3), np.uint8)

def sees(context):
    return f"sample {context.sample.id}"

def looks(start: float):
    from mmrl.tools.base import looked_at
    looked_at("audio", "/data/a.wav", span=np.array([start, start + 1], np.float32),
              duration=np.float32(9))
    return "heard"
'''


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    (root / "my_tools.py").write_text(textwrap.dedent(USER_TOOLS))
    import sys

    sys.path.insert(0, str(root))
    try:
        names = ["describe", "picture", "clip", "tone", "boom", "slow", "bare_frames", "sees",
                 "looks"]
        tools = [load_tool(f"my_tools:{n}", {"suffix": "?"} if n == "describe" else None)
                 for n in names]
        yield Toolbox([load_tool("crop"), *tools], timeout_s=0.5, workers=4)
    finally:
        sys.path.remove(str(root))


def run(box, *calls, offered=None):
    ctx = _context()
    return box.run([(c, ctx, offered or list(box.tools)) for c in calls])


def _context():
    from mmrl.tools.base import ToolContext
    prompt = PromptFeatures(sample=Sample(id="s7", messages=[]), tensors={})
    return ToolContext(prompt=prompt, input_sizes=[], images=[], videos=[], audios=[])


def test_user_tools_return_text_images_frames_and_waveforms(box):
    text, image, frames, wave, ctx = run(
        box, ToolCall("describe", {"word": "hi", "times": 2}), ToolCall("picture", {"side": 30}),
        ToolCall("clip", {"n": 2}), ToolCall("tone", {"seconds": 0.5}), ToolCall("sees", {}))
    assert text.items == ["hi?hi?"]  # the setting suffix="?" is bound, the model set the rest
    assert isinstance(image.items[0], Image.Image) and image.items[0].size == (30, 30)
    content, media = as_content(frames.items)
    assert content == [{"type": "video"}, {"type": "text", "text": "two frames"}]
    assert media["videos"][0].fps == 2.0
    assert wave.items[0].shape == (8000,) and as_content(wave.items)[0] == [{"type": "audio"}]
    assert ctx.items == ["sample s7"]


def test_user_tool_specs_come_from_signature_and_docstring(box):
    spec = box.tools["describe"].spec
    assert spec == {"name": "describe", "description": "Repeat a word.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}, "times": {"type": "integer"}},
        "required": ["word"]}}
    assert box.specs(["describe"])[0]["type"] == "function"
    assert "bbox_2d" in box.tools["crop"].spec["parameters"]["required"]


def test_every_bad_call_is_an_error_of_its_kind(box):
    outcomes = run(box,
                   ToolCall("", {}, error="malformed", detail="not JSON"),
                   ToolCall("nope", {}),
                   ToolCall("describe", {"word": "x", "suffix": "!"}),  # a setting: not the model's
                   ToolCall("picture", {}),
                   ToolCall("boom", {}),
                   ToolCall("slow", {"seconds": 3.0}),
                   ToolCall("bare_frames", {}),
                   ToolCall("crop", {"bbox_2d": [0, 0, 1, 1]}))  # the sample has no image
    kinds = [o.error for o in outcomes]
    assert kinds == ["malformed", "unknown_tool", "bad_arguments", "bad_arguments", "exception",
                     "timeout", "bad_result", "bad_arguments"]
    assert "disk on fire" in outcomes[4].message
    assert "fps" in outcomes[6].message
    assert "no tool 'nope'" in outcomes[1].message


def test_a_tool_not_offered_to_the_sample_is_unknown(box):
    (outcome,) = run(box, ToolCall("describe", {"word": "x"}), offered=["crop"])
    assert outcome.error == "unknown_tool" and "available: crop" in outcome.message


def test_calls_run_concurrently_within_the_time_limit(box):
    run(box, *[ToolCall("slow", {"seconds": 0.0}) for _ in range(4)])  # workers start: not timed
    start = time.monotonic()
    outcomes = run(box, *[ToolCall("slow", {"seconds": 0.3}) for _ in range(4)])
    assert [o.items for o in outcomes] == [["done"]] * 4
    assert time.monotonic() - start < 0.9  # 4 x 0.3 s in one wave of 4 workers


def test_settings_are_checked_at_load():
    with pytest.raises(ValueError, match=r"tools.use\[0\]: crop has no setting \['zoom'\]"):
        load_tool("crop", {"zoom": 2}, "tools.use[0]")
    with pytest.raises(ValueError, match="tools.use: unknown tool 'cropp'"):
        load_tool("cropp")
    with pytest.raises(ValueError, match="cannot import"):
        load_tool("no_such_module_x:fn")
    with pytest.raises(ValueError, match="two tools are called 'crop'"):
        Toolbox([load_tool("crop"), load_tool("crop")])


def test_metrics_count_turns_calls_errors_and_the_turn_cap():
    rows = [Trajectory(turns=3, calls=[ToolCallRecord("crop", {}, 0),
                                       ToolCallRecord("crop", {}, 1, error="bad_box")]),
            Trajectory(turns=2, hit_turn_cap=True,
                       calls=[ToolCallRecord("", {}, 0, error="malformed")]),
            Trajectory(turns=1)]
    m = trajectory_metrics(rows)
    assert m["turns/mean"] == 2.0 and m["tools/calls_mean"] == 1.0
    assert m["tools/called_frac"] == pytest.approx(2 / 3)
    assert m["turns/cap_frac"] == pytest.approx(1 / 3)
    assert m["tools/error_rate"] == pytest.approx(2 / 3)
    assert m["tools/calls/crop"] == pytest.approx(2 / 3)
    assert m["tools/errors/bad_box"] == m["tools/errors/malformed"] == pytest.approx(1 / 3)
    assert m["tools/errors/timeout"] == 0.0


def test_waveforms_must_be_float():
    from mmrl.tools import as_items

    with pytest.raises(TypeError, match="a tool may return"):
        as_items(np.zeros(10, np.int16))
    with pytest.raises(TypeError, match="returned nothing"):
        as_items([])


def test_results_the_processor_would_refuse_are_bad_results():
    from mmrl.data.media import Video
    from mmrl.tools import as_items

    for value, message in [(Image.new("RGB", (1, 300)), "aspect ratio"),
                           (Video(frames=np.zeros((0, 8, 8, 3), np.uint8), fps=2.0, timestamps=[],
                                  duration=0.0), "T >= 1"),
                           (np.zeros(100, np.float32), "at least 0.1 s")]:
        with pytest.raises(TypeError, match=message):
            as_items(value)
    assert as_items(Image.new("L", (4, 4)))[0].mode == "RGB"


def test_a_call_records_what_it_read_and_its_error_message(box):
    from mmrl.tools.base import looked_at

    looks, boom = run(box, ToolCall("looks", {"start": 0.5}), ToolCall("boom", {}))
    note = {"media": "audio", "path": "/data/a.wav", "span": [0.5, 1.5], "duration": 9.0}
    assert looks.seen == [note]  # numpy values as plain numbers: rollouts.jsonl takes them
    assert looks.record(ToolCall("looks", {"start": 0.5}), 2) == ToolCallRecord(
        "looks", {"start": 0.5}, 2, seconds=looks.seconds, seen=[note])
    failed = boom.record(ToolCall("boom", {}), 0)
    assert failed.error == "exception" and "disk on fire" in failed.message and not failed.seen
    looked_at("image", "x.png", box=[0, 0, 1, 1])  # outside a call: nothing to record, no error
