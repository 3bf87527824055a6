"""Tools that can be stopped (issue #56 item 2): user tools run in worker processes that are
killed at `tools.timeout_s`, even when they hold the interpreter lock; a huge text result is
refused by its length before the tokenizer sees it; media from any tool pass the records' pixel,
frame and duration guards; a stop signal during a tool call abandons the step within
`train.stop_timeout`, its worker killed."""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from mmrl.models.codec import Codec
from mmrl.data.media import Video
from mmrl.models import get_adapter
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.tools import Toolbox, load_tool, trajectory_metrics
from mmrl.tools.base import ToolContext
from mmrl.tools.calls import ToolCall
from mmrl.train.signals import StepAbandoned, StopSignals
from mmrl.types import PromptFeatures, Sample, SamplingParams
from tests.rollout.scripted import ScriptedEngine

# A backtracking regex holds the interpreter lock for the whole match: 2x per extra "a"
# (n = 27: ~30 s here), so a thread-based timeout cannot end it.
TOOLS = '''
import os, re, time
import numpy as np
from PIL import Image
from mmrl.data.media import Video

def backtrack(text: str, pid_file: str = ""):
    if pid_file:
        open(pid_file, "w").write(str(os.getpid()))
    return str(bool(re.match(r"(a+)+$", text)))

def huge(n: int):
    return "x" * n

def big_image(w: int, h: int):
    return Image.new("L", (w, h))

def long_clip(n: int):
    return Video(frames=np.zeros((n, 28, 28, 3), np.uint8), fps=2.0,
                 timestamps=[i / 2 for i in range(n)], duration=n / 2)

def wave(seconds: float):
    return np.zeros(int(16000 * seconds), np.float32)

def die():
    os._exit(3)
'''
SLOW = "a" * 27 + "!"


@pytest.fixture(scope="module")
def user_tools(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker_tools")
    (root / "mmrl_worker_tools.py").write_text(textwrap.dedent(TOOLS))
    sys.path.insert(0, str(root))
    try:
        yield [load_tool(f"mmrl_worker_tools:{n}")
               for n in ("backtrack", "huge", "big_image", "long_clip", "wave", "die")]
    finally:
        sys.path.remove(str(root))


@functools.lru_cache(maxsize=None)
def tiny():
    adapter = get_adapter("qwen2_5_vl")
    return adapter, adapter.tiny(seed=0)[1]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def step(box: Toolbox, turn: str, rows: int = 1, max_observation_tokens: int = 300):
    """One trajectory step of `rows` rows: every row makes the calls of `turn`, then answers."""
    adapter, processor = tiny()
    engine = ScriptedEngine(processor.tokenizer, [[turn], ["<answer>A</answer>"]])
    prompt = adapter.prompt_features(processor, Sample(id="s", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Go."}]}]))
    loop = TrajectoryRollout(engine, Codec(adapter, processor), box, TrajectorySettings(
        max_turns=2, max_tokens=1000, max_observation_tokens=max_observation_tokens))
    return loop.rollout([prompt], SamplingParams(num_generations=rows, max_new_tokens=200))


def context() -> ToolContext:
    return ToolContext(prompt=PromptFeatures(sample=Sample(id="s", messages=[]), tensors={}),
                       input_sizes=[], images=[], videos=[], audios=[])


def test_a_step_with_a_lock_holding_tool_ends_at_its_timeout(user_tools):
    box = Toolbox(user_tools, timeout_s=3, workers=4)
    step(box, call("backtrack", text="aaaa!"), rows=4)  # the workers start (not timed)
    start = time.monotonic()
    fast = step(box, call("backtrack", text="aaaa!"), rows=4)
    own = time.monotonic() - start  # the step's own time, its calls answered at once
    start = time.monotonic()
    slow = step(box, call("backtrack", text=SLOW), rows=4)
    took = time.monotonic() - start
    # Before: 4 calls of ~30 s each, one after another on the interpreter lock (> 60 s).
    assert took < own + 3 + 2.5, (took, own)
    assert [c.error for t in fast.trajectories for c in t.calls] == [None] * 4
    assert [c.error for t in slow.trajectories for c in t.calls] == ["timeout"] * 4
    metrics = trajectory_metrics(slow.trajectories)
    assert metrics["tools/errors/timeout"] == 1.0 and metrics["tools/error_rate"] == 1.0
    # The pool goes on: killed workers are replaced.
    (again,) = box.run([(ToolCall("backtrack", {"text": "aa!"}), context(), ["backtrack"])])
    assert again.items == ["False"]


def test_huge_text_is_refused_by_its_length_before_tokenizing(user_tools):
    box = Toolbox(user_tools, timeout_s=30)
    step(box, call("huge", n=1))  # the model and the worker start (not timed)
    start = time.monotonic()
    batch = step(box, call("huge", n=10_000_000))
    took = time.monotonic() - start
    (c,) = batch.trajectories[0].calls
    assert c.error == "too_long" and "10000000 characters" in c.message
    assert took < 5.0  # before: the 10 MB were tokenized first (150 s on Qwen's tokenizer)
    # Under the limit, text is tokenized and measured as before.
    (c,) = step(box, call("huge", n=40), max_observation_tokens=20).trajectories[0].calls
    assert c.error == "too_long" and "tokens, over the limit of 20" in c.message


def test_media_from_a_user_tool_pass_the_records_guards(user_tools):
    box = Toolbox(user_tools, timeout_s=30)
    box.max_audio_seconds = 2.0  # data.audio_max_seconds
    ctx = context()  # image budget 200704 px: a run decodes max(4 x that, 16 MP) = 16 MP
    calls = [ToolCall("big_image", {"w": 5000, "h": 4000}), ToolCall("big_image", {"w": 64, "h": 64}),
             ToolCall("long_clip", {"n": 65}), ToolCall("long_clip", {"n": 4}),
             ToolCall("wave", {"seconds": 3.0}), ToolCall("wave", {"seconds": 1.0})]
    ctx = box.context(PromptFeatures(sample=Sample(id="s", messages=[]), tensors={}), Codec(*tiny()))
    out = box.run([(c, ctx, list(box.tools)) for c in calls])
    assert [o.error for o in out] == ["bad_result", None] * 3
    assert "20.0 MP, over the 16.0 MP" in out[0].message
    assert "65 frames, over the 64" in out[2].message
    assert "3 s, over data.audio_max_seconds=2" in out[4].message


def test_a_worker_that_dies_answers_its_call_as_an_exception(user_tools):
    box = Toolbox(user_tools, timeout_s=30)
    (died,) = box.run([(ToolCall("die", {}), context(), ["die"])])
    assert died.error == "exception" and "worker process died (exit code 3)" in died.message


def test_a_stop_signal_during_a_tool_call_abandons_the_step_within_stop_timeout(user_tools,
                                                                              tmp_path):
    box = Toolbox(user_tools, timeout_s=120)
    box.run([(ToolCall("backtrack", {"text": "a!"}), context(), ["backtrack"])])  # warm
    pid_file = tmp_path / "pid"
    job = (ToolCall("backtrack", {"text": SLOW, "pid_file": str(pid_file)}), context(),
           ["backtrack"])
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    start = time.monotonic()
    with StopSignals(timeout=1.0, say=lambda line: None) as signals:
        with pytest.raises(StepAbandoned):
            with signals.abandonable():
                box.run([job])
    took = time.monotonic() - start
    assert signals.name == "SIGTERM" and took < 0.5 + 1.0 + 1.5, took
    pid = int(pid_file.read_text())
    assert pid != os.getpid()  # the call ran in a worker process, which is gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
