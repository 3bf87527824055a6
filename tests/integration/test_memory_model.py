"""The memory model against measured peaks: real training steps of three small models on CPU
(three families; gradient checkpointing with the naive layout, audio, LoRA with the shared
layout), each in a fresh process, predicted within 15% of the measured peak.

The model is told what a user would tell it: the config, and the prompt length and media tokens
of the data (read from the prompts the run drew)."""
from __future__ import annotations

import pytest

from mmrl import plan
from mmrl.bench import peak
from mmrl.config import load

pytestmark = pytest.mark.integration

CASES = {
    "qwen2_5_vl, checkpointing, naive layout, 2 micro-batches": dict(
        family="qwen2_5_vl", generate="counting", size=336, group=8, completion=48, micro=8,
        tiny="{hidden_size: 512, intermediate_size: 1536, num_hidden_layers: 3, "
             "num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 16384, "
             "max_pixels: 200704}",
        extra=["model.gradient_checkpointing=true", "train.shared_prefix=false"]),
    "qwen2_audio, full logits, shared layout": dict(
        family="qwen2_audio", generate="audio_qa", size=None, group=4, completion=24, micro=4,
        tiny="{hidden_size: 320, intermediate_size: 896, num_hidden_layers: 3, "
             "num_attention_heads: 5, num_key_value_heads: 1, vocab_size: 20480}",
        rewards="[{name: accuracy, params: {mode: choice}}]"),
    "qwen3_vl, LoRA r=8, shared layout": dict(
        family="qwen3_vl", generate="counting", size=256, group=4, completion=32, micro=4,
        tiny="{hidden_size: 512, intermediate_size: 1408, num_hidden_layers: 4, "
             "num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 40960}",
        extra=["model.lora.r=8"]),
}


def _overrides(case: dict, tmp) -> list[str]:
    kwargs = "{n_train: 8, n_eval: 2" + (f", size: {case['size']}" if case["size"] else "") + "}"
    return [f"data.train={tmp}/data/train.jsonl", "data.format=mmrl",
            f"data.generate={case['generate']}", f"data.generate_kwargs={kwargs}",
            f"model.family={case['family']}", "model.path=tiny", f"model.tiny={case['tiny']}",
            "model.dtype=float32", "rollout.prompts_per_step=2",
            f"rollout.num_generations={case['group']}",
            f"rollout.max_new_tokens={case['completion']}", "algo.beta=0.04",
            f"train.micro_batch_size={case['micro']}", "train.steps=2", "train.save_every=0",
            "eval.before_rl=false", "log.tensorboard=false", "log.progress=off",
            "log.rollouts_every=0", f"log.run_dir={tmp}/run",
            "rewards=" + case.get("rewards", "[{name: count}, {name: format, weight: 0.5}]"),
            *case.get("extra", [])]


@pytest.mark.parametrize("name", list(CASES))
def test_plan_predicts_the_measured_cpu_peak_within_15_percent(name, tmp_path):
    overrides = _overrides(CASES[name], tmp_path)
    measured = peak.measure(None, overrides, steps=2, threads=1)
    assert measured["device"] == "cpu" and measured["prompt_tokens"] > 0
    cfg = load(None, overrides)
    facts, _ = plan.config_facts(cfg)
    workload, _ = plan.config_workload(
        cfg, facts, 1, media_tokens=measured["vision_tokens"],
        prompt_tokens=measured["prompt_tokens"],
        audio_frames=facts.audio_window if measured["audio_tokens"] else 0)
    predicted = plan.predict(facts, workload, plan.Cluster(gpu_gib=24, device="cpu"))
    ratio = predicted.peak / measured["peak_bytes"]
    assert 0.85 <= ratio <= 1.15, (f"{name}: predicted {predicted.peak / 2**20:.0f} MB "
                                   f"({predicted.phase}), measured "
                                   f"{measured['peak_bytes'] / 2**20:.0f} MB")
