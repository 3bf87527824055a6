"""Fuzzed tool-call text through the trajectory loop (issue #56 item 6): hypothesis writes model
turns of calls -- special tokens, broken JSON, huge numbers, unicode, deep nesting, unclosed tags
-- and each goes through the loop on a tiny Qwen2.5-VL with the real processor: parsed, run
(the `crop` built-in and user tools in their worker processes), answered by an observation and
encoded. At least 500 calls; none crashes, none vanishes, every bad call is counted, and each
observation holds exactly its template's markup and its results' media. A few trajectories then
go on with real generation and the training forward over the fuzzed observations."""
from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.tools import Toolbox, load_tool, parse_turn, trajectory_metrics
from mmrl.tools.base import ERROR_KINDS
from mmrl.tools.calls import CALL_CLOSE, CALL_OPEN
from mmrl.types import Sample, SamplingParams
from tests.rollout.scripted import ScriptedEngine

USER = '''
def echo(text: str):
    """Say it back."""
    return "heard: " + text

def count(n: int):
    """Count to n."""
    return " ".join(str(i) for i in range(min(n, 30)))
'''
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|AUDIO|>", "<|audio_bos|>",
            "<|audio_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
            "<|image_placeholder|>", "<|placeholder|>", "<tool_response>", "</tool_response>"]
JSONISH = ["{", "}", "[", "]", '"', ",", ":", "\\", "\\u00", CALL_OPEN, CALL_CLOSE, "NaN",
           "-Infinity", "1e999", "9" * 5000, "[" * 3000, "{\"a\":" * 1500, "\U0001F600", "\x00",
           "日本語", "\u202e", "é"]

NO_SHRINK = [Phase.explicit, Phase.generate]  # a failure is reported as found: shrinking is slow
texts = st.one_of(st.text(max_size=12), st.sampled_from(SPECIALS))


def _junk(atoms: list[str]):
    return st.lists(st.one_of(texts, st.sampled_from(atoms)), max_size=6).map("".join)


junk = _junk(JSONISH)
short_junk = _junk([a for a in JSONISH if len(a) < 50])  # for turns a model then continues
numbers = st.one_of(st.integers(-10**60, 10**60), st.sampled_from([10**400, -10**400, 2**63]),
                    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False))
values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                      lambda inner: st.one_of(st.lists(inner, max_size=4),
                                              st.dictionaries(texts, inner, max_size=3)),
                      max_leaves=10)
names = st.one_of(st.sampled_from(["crop", "echo", "count"]), texts)
arguments = st.dictionaries(st.one_of(st.sampled_from(["bbox_2d", "image", "text", "n"]), texts),
                            values, max_size=3)


def _json_call(name, args) -> str:
    return CALL_OPEN + json.dumps({"name": name, "arguments": args}) + CALL_CLOSE


def _calls(junk):
    return st.one_of(
        st.builds(_json_call, names, arguments),
        st.builds(lambda box, image: _json_call("crop", {"bbox_2d": box, "image": image}),
                  st.lists(st.one_of(st.integers(-100, 300), numbers), max_size=5),
                  st.sampled_from([1, 2, 0, 1.5, "1", 10**30])),
        st.builds(lambda text: _json_call("echo", {"text": text}), junk),
        st.builds(lambda n: _json_call("count", {"n": n}), numbers),
        st.builds(lambda body: CALL_OPEN + body + CALL_CLOSE, junk),  # broken JSON
        st.builds(lambda body: CALL_OPEN + json.dumps({"name": "echo", "arguments": body})
                  + CALL_CLOSE, junk),  # arguments as a string that may or may not be JSON
    )


def _turns(junk, most: int):
    """Calls with text before and between them (no huge pieces there: a turn stays a turn)."""
    return st.tuples(st.lists(_calls(junk), min_size=3, max_size=most), short_junk,
                     short_junk).map(lambda t: t[1] + t[2].join(t[0]))


turns = _turns(junk, 10)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """(adapter, model, processor, toolbox, prompt) on a tiny Qwen2.5-VL with one image."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "mmrl_fuzz_tools.py").write_text(textwrap.dedent(USER))
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (112, 140, 3), np.uint8)).save(
        root / "im.png")
    sys.path.insert(0, str(root))
    try:
        adapter = get_adapter("qwen2_5_vl")
        model, processor = adapter.tiny(seed=0)
        box = Toolbox([load_tool("crop"), load_tool("mmrl_fuzz_tools:echo"),
                       load_tool("mmrl_fuzz_tools:count")], timeout_s=30, workers=2)
        image = Image.open(root / "im.png").convert("RGB").resize((56, 56))
        sample = Sample(id="f", images=[str(root / "im.png")], messages=[{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "Look."}]}])
        prompt = adapter.prompt_features(processor, sample, [image])
        prompt.media = {"images": [image]}
        yield adapter, model, processor, box, prompt
    finally:
        sys.path.remove(str(root))


def _loop(fuzz, engine, max_turns=2):
    adapter, _, processor, box, _ = fuzz
    return TrajectoryRollout(engine, Codec(adapter, processor), box, TrajectorySettings(
        max_turns=max_turns, max_tokens=200_000, max_observation_tokens=20000))


def _check_observation(processor, batch, row: int) -> None:
    """Decodes to its text; its markup is the template's and one placeholder run per image."""
    tok = processor.tokenizer
    ids_of = tok.convert_tokens_to_ids
    allowed = {ids_of(s) for s in ("<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                   "<|vision_end|>", "<|image_pad|>")}
    for obs in batch.trajectories[row].observations:
        ids = batch.completion_ids[row, obs.start:obs.start + obs.length]
        assert tok.decode(ids) == obs.text
        added = [i for i in ids.tolist() if i in set(tok.added_tokens_decoder)]
        assert set(added) <= allowed, [tok.decode([i]) for i in set(added) - allowed]
        images = len(obs.media.get("images", []))
        grid = obs.tensors.get("image_grid_thw")
        pads = 0 if grid is None else int(grid.prod(-1).sum()) // 4  # 2x2 merge
        assert (added.count(ids_of("<|im_start|>")), added.count(ids_of("<|vision_start|>")),
                added.count(ids_of("<|image_pad|>"))) == (2, images, pads)


def test_fuzzed_calls_through_the_trajectory_loop(fuzz):
    adapter, _, processor, box, prompt = fuzz
    seen = {"calls": 0, "bad": 0, "kinds": set()}

    @settings(max_examples=120, deadline=None, derandomize=True, database=None, phases=NO_SHRINK,
              suppress_health_check=list(HealthCheck))
    @given(turn=st.one_of(turns, turns.map(lambda t: t + CALL_OPEN)))  # and an unclosed tag
    def check(turn):
        engine = ScriptedEngine(processor.tokenizer, [[turn], ["<answer>A</answer>"]])
        batch = _loop(fuzz, engine).rollout([prompt], SamplingParams(num_generations=1,
                                                                     max_new_tokens=150_000))
        (t,) = batch.trajectories
        expected = parse_turn(t.turn_texts[0], "qwen").calls
        assert len(t.calls) == len(expected) >= 1  # every call answered, none vanished
        assert t.turns == 2 and not bool(batch.truncated[0]) and len(t.observations) == 1
        bad = [c.error for c in t.calls if c.error is not None]
        assert set(bad) <= set(ERROR_KINDS)
        metrics = trajectory_metrics(batch.trajectories)
        assert sum(metrics[f"tools/errors/{k}"] for k in ERROR_KINDS) == len(bad)
        _check_observation(processor, batch, 0)
        seen["calls"] += len(t.calls)
        seen["bad"] += len(bad)
        seen["kinds"] |= set(bad) | ({"ok"} if len(bad) < len(t.calls) else set())

    check()
    assert seen["calls"] >= 500, seen
    assert {"malformed", "unknown_tool", "bad_arguments", "ok"} <= seen["kinds"], seen


@settings(max_examples=3, deadline=None, derandomize=True, database=None, phases=NO_SHRINK,
          suppress_health_check=list(HealthCheck))
@given(turn=_turns(short_junk, 4))
def test_fuzzed_observations_go_on_with_real_generation_and_the_training_forward(fuzz, turn):
    adapter, model, processor, _, prompt = fuzz
    later = HFEngine(model, processor)
    engine = ScriptedEngine(processor.tokenizer, [[turn]], later=later, later_tokens=12)
    batch = _loop(fuzz, engine, max_turns=3).rollout([prompt], SamplingParams(
        num_generations=2, max_new_tokens=30000, do_sample=True, temperature=1.0, seed=0,
        suppress_ids=adapter.placeholder_token_ids(processor)))
    for row in range(batch.n):
        assert batch.trajectories[row].turns >= 2 and batch.trajectories[row].observations
        _check_observation(processor, batch, row)
    pad = processor.tokenizer.pad_token_id
    with torch.no_grad():
        inputs = collate(batch.prompts, batch.completion_ids, batch.completion_mask, pad,
                         observations=batch.observations())
        logp = completion_logprobs(model, inputs, batch.completion_ids, batch.policy_mask)
    assert torch.isfinite(logp).all() and logp.shape == batch.completion_ids.shape
