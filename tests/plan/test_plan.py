"""The memory model's parts against hand-computed values and the real thing: the meta-device
activation count equals a real CPU forward's, the static terms per strategy, the tokens a
micro-batch runs, the CLI, and the recipe READMEs' fit sections are current."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mmrl import plan
from mmrl.plan import fit, memory, probe, report as plan_report

GIB = 2 ** 30


def test_meta_probe_equals_what_a_real_cpu_forward_saves():
    """One text layer of the tiny Qwen2.5-VL: bytes autograd saves per token, counted on the
    meta device with the fused-attention shim, equal those of a real float32 forward on CPU
    (whose sdpa runs a fused kernel with no mask)."""
    from mmrl.models import get_adapter

    model, _ = get_adapter("qwen2_5_vl").tiny()
    lm = model.model.language_model
    layer, tokens = lm.layers[0], 64
    x = torch.randn(1, tokens, lm.config.hidden_size, requires_grad=True)
    pos = torch.arange(tokens)[None][None].expand(3, 1, -1)
    cos_sin = lm.rotary_emb(x, pos)
    real = probe._saved_bytes(layer, lambda: layer(x, attention_mask=None, position_ids=pos[0],
                                                   position_embeddings=cos_sin), list(cos_sin))
    fresh, _ = get_adapter("qwen2_5_vl").tiny()
    counted = probe.block_costs(fresh.to("meta"), torch.float32)
    assert counted["text"].saved_per_token == real / tokens
    assert counted["text"].count == 4 and counted["vision"].count == 2


def _facts(**kw) -> plan.Facts:
    blocks = {"text": probe.BlockCost(130_000, 2048, 28, 11008),
              "vision": probe.BlockCost(66_000, 1280, 32, 3420)}
    base = dict(params=10 ** 9, trainable=10 ** 9, largest=10 ** 8, layer_params=2 * 10 ** 7,
                root_params=2 * 10 ** 8, dtype_bytes=2, hidden=2048, vocab=150000, layers=28,
                kv_per_token=57344, merge=2, blocks=blocks)
    return plan.Facts(**{**base, **kw})


def _work(**kw) -> plan.Workload:
    base = dict(prompt_tokens=1152, media_tokens=1024, audio_frames=0, completion=512, group=8,
                prompts=2, micro_batch=4)
    return plan.Workload(**{**base, **kw})


def test_static_terms_per_strategy_by_hand():
    f, w = _facts(), _work()
    ddp = plan.static_terms(f, w, plan.Cluster(80, 8, "ddp"))
    assert ddp == {"weights": 2e9, "KL reference": 2e9, "optimizer (m, v)": 4e9}
    zero2 = plan.static_terms(f, w, plan.Cluster(80, 8, "zero2"))
    assert zero2["optimizer (fp32 master, m, v)"] == 12e9 / 8 and zero2["weights"] == 2e9
    zero3 = plan.static_terms(f, w, plan.Cluster(80, 8, "zero3"))
    assert zero3["weights"] == 2e9 / 8 and zero3["KL reference"] == 2e9 / 8
    assert zero3["weights gathered"] == (2e8 + 0.9 * 2048 ** 2) * 2
    fsdp2 = plan.static_terms(f, w, plan.Cluster(80, 8, "fsdp2"))
    assert fsdp2["optimizer (m, v)"] == 4e9 / 8
    assert fsdp2["weights gathered"] == (2e8 + 2 * 2e7) * 2
    lora = plan.static_terms(_facts(trainable=10 ** 7), _work(lora_r=16), plan.Cluster(80, 1))
    assert "KL reference" not in lora and lora["optimizer (m, v)"] == 4e7
    grads = plan.gradient_terms(f, w, plan.Cluster(80, 8, "ddp"))
    assert grads == {"gradients": 2e9, "optimizer step temporaries": 2e9}


def test_micro_batch_tokens_count_every_group_it_touches():
    # G = 6, micro-batches of 4 rows over 12 rows: rows 4..7 touch both groups.
    w = _work(prompt_tokens=100, completion=10, group=6, prompts=2, micro_batch=4)
    assert memory._tokens(w, 4) == (2 * 100 + 4 * 9, 2, 2)
    aligned = _work(prompt_tokens=100, completion=10, group=4, prompts=2, micro_batch=4)
    assert memory._tokens(aligned, 4) == (100 + 4 * 9, 1, 1)
    naive = _work(prompt_tokens=100, completion=10, shared_prefix=False)
    assert memory._tokens(naive, 4) == (4 * 110, 4, 4)


def test_more_gpus_and_sharding_lower_the_peak_and_the_largest_knobs_fit():
    f, w = _facts(), _work()
    one = plan.predict(f, w, plan.Cluster(80, 1, "ddp"))
    sharded = plan.predict(f, w, plan.Cluster(80, 8, "zero3"))
    assert sharded.peak < one.peak
    best = plan.largest_micro_batch(f, w, plan.Cluster(80, 8, "zero3"))
    assert best >= 1
    assert plan.predict(f, replace(w, micro_batch=best), plan.Cluster(80, 8, "zero3")).fits
    if best < w.prompts * w.group:
        assert not plan.predict(f, replace(w, micro_batch=best + 1),
                                plan.Cluster(80, 8, "zero3")).fits


def test_cli_prints_the_prediction_and_exits_1_when_it_does_not_fit(capsys):
    config = "recipes/counting/config.yaml"
    assert plan_report.main([config, "model.path=tiny", "--media-tokens", "64", "--json",
                             "--gpu-gib", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["largest_micro_batch"] >= 1 and out["peak"] > 0
    assert plan_report.main([config, "model.path=tiny", "--media-tokens", "64",
                             "--gpu-gib", "1.05"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--media-tokens"):
        plan_report.main([config, "model.path=tiny"])
    from mmrl.cli import main  # the `mmrl plan` entry reaches the same

    assert main(["plan", config, "model.path=tiny", "--media-tokens", "64"]) == 0
    assert "fits" in capsys.readouterr().out


@pytest.mark.parametrize("config", sorted(Path(plan_report.RECIPES).glob("*/config.yaml")),
                         ids=lambda p: p.parent.name)
def test_recipe_readme_states_the_current_prediction(config):
    text = (config.parent / "README.md").read_text()
    section = plan_report.readme_section(config, text)
    assert section in text, (f"{config.parent / 'README.md'} is stale: run "
                             f"python -m mmrl.plan.report --readmes")


def test_sequence_parallel_divides_each_ranks_activations_not_its_rollout():
    f = _facts()
    one, two = (plan.activation_terms(f, _work(sequence_parallel=n), 4) for n in (1, 2))
    tokens = 1152 + 4 * 511  # one group's prompt, 4 completions less their last token
    assert two["text activations"] == one["text activations"] * (-(-tokens // 2)) / tokens
    assert two["vision activations"] == one["vision activations"] / 2  # half the patches
    # The 4 x 512 completion tokens fit in one rank's half (1598 + ...): it holds their logits.
    assert two["logits"] == one["logits"] * min(4 * 512, -(-tokens // 2)) / (4 * 512)
    four = plan.activation_terms(f, _work(sequence_parallel=4), 4)
    assert four["logits"] == one["logits"] * -(-tokens // 4) / (4 * 512)
    assert "attention mask" not in two  # a varlen kernel: no mask
    assert two["all-to-all buffers"] == 2 * 4 * -(-tokens // 2) * f.hidden * f.dtype_bytes
    # sdpa: the [1, 1, T, T] boolean group mask, whole on every rank (not divided by N).
    dense = [plan.activation_terms(f, _work(sequence_parallel=n, dense_mask=True), 4)
             for n in (1, 2)]
    assert dense[0]["attention mask"] == dense[1]["attention mask"] == tokens * tokens
    naive = plan.activation_terms(f, _work(dense_mask=True, shared_prefix=False), 4)
    assert naive["attention mask"] == 4 * (1152 + 512) ** 2  # [rows, 1, L, L]
    p1, p2 = (plan.predict(f, _work(sequence_parallel=n), plan.Cluster(80, 8, "zero3"))
              for n in (1, 2))
    assert p2.phases["update"] < p1.phases["update"]
    assert p2.phases["rollout"] == p1.phases["rollout"]  # each rank samples its own prompts


def test_config_workload_gives_each_process_its_share_of_the_prompts():
    from mmrl import config

    cfg = config.load("recipes/video_qa/config.yaml", ["recipes/video_qa/long.yaml"], world=8)
    f = _facts()
    w, _ = plan.config_workload(cfg, f, 8)
    assert (w.sequence_parallel, w.prompts) == (4, 2)  # 16 prompts over 8 processes
    with pytest.raises(ValueError, match="must divide by the 8 processes"):
        plan.config_workload(config.load("recipes/video_qa/config.yaml",
                                         ["recipes/video_qa/long.yaml", "rollout.prompts_per_step=12"],
                                         world=4), f, 8)


def test_shared_prefill_in_rounds_holds_the_cache_the_plan_counts():
    """A real tiny Qwen2.5-VL samples G = 8 in rounds of 2 from one prefill per prompt: the KV
    cache it holds at its peak (generate_shared's own count) is the plan's, less the prefill
    copy the plan adds for the moment a round's cache is made (and one token: the last sampled
    token is never fed back)."""
    from PIL import Image

    from mmrl.models import get_adapter
    from mmrl.models.shared_generate import generate_shared
    from mmrl.types import Sample, SamplingParams

    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    sample = Sample(id="a", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many?"}]}])
    prompts = [adapter.prompt_features(processor, sample, [Image.new("RGB", (56, 84), c)])
               for c in ("white", "red")]
    stats = {}
    generate_shared(model, processor, prompts, SamplingParams(
        num_generations=8, max_new_tokens=6, seed=0, eos_ids=[]), rounds_of=2, stats=stats)
    f = plan.model_facts(model, torch.float32)
    p = prompts[0].input_ids.shape[0]
    w = _work(prompt_tokens=p, completion=6, group=8, prompts=2, shared_prefill=True, rounds_of=2)
    counted = plan.rollout_terms(f, w)["KV cache"] - 2 * p * f.kv_per_token  # less the copy
    assert stats["peak_cache_bytes"] == counted - 2 * 2 * f.kv_per_token
    whole = plan.rollout_terms(f, _work(prompt_tokens=p, completion=6, group=8, prompts=2))
    assert whole["KV cache"] == 2 * 8 * (p + 6) * f.kv_per_token  # HF generate: every row
    assert whole["prefill working set"] == 8 * plan.rollout_terms(f, w)["prefill working set"]


def test_a_colocated_vllm_engine_holds_its_share_and_samples_inside_it():
    f, w = _facts(), _work(engine_share=0.3)
    p = plan.predict(f, w, plan.Cluster(80, 1, "ddp"))
    assert p.terms["vLLM engine (colocated)"] == 0.3 * 80 * plan.GIB
    assert plan.rollout_terms(f, w) == {}
    assert p.phases["rollout"] == sum(plan.static_terms(f, w, p.cluster).values())


@pytest.mark.parametrize("overrides, strategy", [
    ([], "ddp"), (["train.parallel=fsdp2"], "fsdp2"),
    (["train.parallel=deepspeed", "train.deepspeed_config=scripts/deepspeed/zero2.json"], "zero2"),
    (["train.deepspeed_config=scripts/deepspeed/zero3.json"], "zero3"),  # auto reads it
    (["train.parallel=deepspeed", "train.deepspeed_config=scripts/deepspeed/zero2_offload.json"],
     None),  # offload: not modelled
])
def test_the_plan_reads_the_strategy_the_run_would_use(overrides, strategy, monkeypatch):
    from mmrl import config

    monkeypatch.chdir(Path(plan_report.RECIPES).parent)
    for key in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(key, raising=False)
    cfg = config.load("recipes/vqa/config.yaml", overrides, world=8)
    assert fit.config_strategy(cfg, 8) == strategy


def test_a_tool_row_is_planned_at_its_trajectory_bound():
    from mmrl import config

    cfg = config.load("recipes/visual_search/config.yaml", [], world=1)
    assert (cfg.rollout.max_new_tokens, cfg.tools.max_tokens) == (1024, 8192)
    w, _ = plan.config_workload(cfg, _facts(), 1)
    assert w.completion == 8192  # model and observation tokens of a whole trajectory
    assert w.engine_share == 0.3 and not w.shared_prefill  # colocated vLLM samples
    single, _ = plan.config_workload(config.load("recipes/vqa/config.yaml", [], world=1),
                                     _facts(), 1, media_tokens=1024)
    assert single.completion == 512
