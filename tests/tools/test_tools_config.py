"""The `tools` config section: its ranges and cross-field rules fail at load naming the key,
`mmrl validate` resolves every tool and its settings, the summary says what the run offers."""
from __future__ import annotations

import pytest

from mmrl import config
from mmrl.cli import config_summary
from mmrl.config_rules import problems
from mmrl.validate import validate

BASE = ["data.train=x.jsonl", "rewards=[{name: accuracy}]"]


def load(*overrides):
    return config.load(None, [*BASE, *overrides])


def test_defaults_are_single_turn():
    cfg = load()
    assert not cfg.tools.enabled and "tools:" not in config_summary(cfg)


@pytest.mark.parametrize("override, message", [
    ("tools.max_turns=0", "tools.max_turns=0: must be >= 1"),
    ("tools.timeout_s=0", "tools.timeout_s=0.0: must be > 0"),
    ("tools.max_observation_tokens=2000", "tools.max_observation_tokens=2000: must be below "
                                          "tools.max_tokens=1024"),
    ("rollout.max_new_tokens=2000", "rollout.max_new_tokens=2000: must be <= tools.max_tokens"),
    ("tools.call_format=xml", "tools.call_format"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load("tools.use=[{name: crop}]", override)


def test_validate_resolves_tools_and_settings():
    cfg = load("tools.use=[{name: crop, params: {coords: norm1000}}, {name: frames}]",
               "tools.max_turns=2", "tools.eval_max_turns=5")
    assert validate(cfg) == []
    assert "tools: crop, frames (qwen calls, up to 2 turns and 1024 tokens" in config_summary(cfg)
    bad = load("tools.use=[{name: crop, params: {zoom: 2}}, {name: no_mod_x:fn}]")
    assert any("crop has no setting ['zoom']" in p for p in validate(bad))
    worse = load("tools.use=[{name: no_mod_x:fn}]")
    assert any(p.startswith("tools.use: tools.use[0]: tool 'no_mod_x:fn': cannot import")
               for p in validate(worse))
    with pytest.raises(config.ConfigError, match="names a tool twice"):
        load("tools.use=[{name: crop}, {name: crop}]")


@pytest.mark.parametrize("override, message", [
    ("algo.gt_threshold=0.5", "algo.gt_threshold=0.5 cannot run with tools.use"),
    ("algo.tgrpo_alpha=0.3", "algo.tgrpo_alpha=0.3 cannot run with tools.use"),
])
def test_options_the_trajectories_are_not_wired_into_are_refused(override, message):
    with pytest.raises(config.ConfigError, match=message):
        load("tools.use=[{name: crop}]", override)
    load(override)  # fine without tools


def test_tools_on_vllm_run_colocated_or_served_and_video_tools_only_where_verified():
    tools = "tools.use=[{name: crop}, {name: audio_clip}]"
    assert load(tools, "rollout.backend=vllm").rollout.backend == "vllm"  # qwen2_5_vl, colocated
    server = ("rollout.backend=vllm", "rollout.vllm.server_url=http://h:8000")
    assert load(tools, *server).rollout.vllm.server_url == "http://h:8000"
    with pytest.raises(config.ConfigError, match="tools.use frames cannot run with rollout.vllm."
                       "server_url .the server takes media as data URLs"):
        load("tools.use=[{name: crop}, {name: frames}]", *server)
    for family in ("qwen3_vl", "qwen2_5_omni", "qwen2_audio"):  # images and audio: every family
        load("tools.use=[{name: crop}, {name: audio_clip}]", "rollout.backend=vllm",
             f"model.family={family}")
    frames = "tools.use=[{name: crop}, {name: frames}]"
    with pytest.raises(config.ConfigError, match="tools.use frames with model.family=qwen3_vl "
                       "cannot run on rollout.backend=vllm .vLLM expands Qwen3-VL's timestamped video"):
        load(frames, "rollout.backend=vllm", "model.family=qwen3_vl")
    with pytest.raises(config.ConfigError, match="model.family=qwen2_5_omni cannot run on rollout."
                       "backend=vllm .vLLM's Qwen2.5-Omni processor expands a video to another "
                       "size.*; video on vLLM: qwen2_5_vl, qwen2_vl.; use rollout.backend=hf"):
        load(frames, "rollout.backend=vllm", "model.family=qwen2_5_omni")
    load(frames, "rollout.backend=vllm", "model.family=qwen2_vl")
    load(frames, "model.family=qwen3_vl")  # fine on HF


def test_sequence_parallel_is_refused_with_tools():
    cfg = load("tools.use=[{name: crop}]", "rollout.prompts_per_step=2")
    cfg.train.sequence_parallel = 2
    assert any(p.startswith("train.sequence_parallel=2 cannot run with tools.use")
               for p in problems(cfg, world=2))


def test_the_tool_use_reward_needs_tools():
    with pytest.raises(config.ConfigError, match="tool_use scores tool calls, and tools.use is "
                                                 "empty"):
        load("rewards=[{name: accuracy}, {name: tool_use, weight: 0.5}]")
    load("rewards=[{name: accuracy}, {name: tool_use}]", "tools.use=[{name: crop}]")
