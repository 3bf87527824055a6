"""Strategy selection, the DeepSpeed config mmrl hands to deepspeed.initialize, and the encoder
"touch" that keeps ZeRO-2/3 / FSDP2 ranks in step (the multi-process runs are in
tests/integration/test_sharded.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl.models.codec import Codec
from mmrl import config
from mmrl.models import get_adapter
from mmrl.models.forward import collate
from mmrl.models.towers import TowerToucher
from mmrl.train import parallel
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_ENV = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "FSDP_VERSION",
                "ACCELERATE_DEEPSPEED_CONFIG_FILE", "ACCELERATE_DEEPSPEED_ZERO_STAGE",
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE")


@pytest.fixture
def cfg(monkeypatch):
    for key in LAUNCHER_ENV:
        monkeypatch.delenv(key, raising=False)
    return config.load(None, ["data.train=x.jsonl", "train.micro_batch_size=4", "train.max_grad_norm=0.5",
                              "model.dtype=bfloat16"])


def test_strategy_follows_the_launcher(cfg, monkeypatch):
    assert parallel.resolve(cfg) == "ddp"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert parallel.resolve(cfg) == "deepspeed"
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="fsdp_version: 2"):
        parallel.resolve(cfg)  # FSDP1 configs are refused, with the fix
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert parallel.resolve(cfg) == "fsdp2"
    cfg.train.parallel = "ddp"  # explicit beats the launcher
    assert parallel.resolve(cfg) == "ddp"
    cfg.train.parallel = "zero4"
    with pytest.raises(ValueError, match="auto, ddp, deepspeed, fsdp2"):
        parallel.resolve(cfg)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"])
def test_shipped_deepspeed_configs_are_completed_by_the_trainer(cfg, monkeypatch, name):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", f"scripts/deepspeed/{name}.json")
    monkeypatch.chdir(ROOT.parent)  # a relative path falls back to the repository
    ds = parallel.deepspeed_config(cfg, world=8)
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 1  # mmrl accumulates micro-batches itself
    assert ds["train_batch_size"] == 32
    assert ds["gradient_clipping"] == 0.5
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    assert "auto" not in json.dumps(ds)  # the rest of "auto" falls to DeepSpeed's defaults
    stage = int(name[4])
    assert ds["zero_optimization"]["stage"] == stage
    assert ("offload_optimizer" in ds["zero_optimization"]) == name.endswith("offload")
    # Given the model's width, the size keys follow it as transformers sets them.
    zero = parallel.deepspeed_config(cfg, world=8, hidden_size=128)["zero_optimization"]
    if stage == 3:
        assert zero["stage3_param_persistence_threshold"] == 1280
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 128 ** 2)
        assert zero["reduce_bucket_size"] == 128 ** 2


def test_deepspeed_config_refuses_keys_mmrl_owns(cfg, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2},
                                "gradient_accumulation_steps": 4}))
    cfg.train.deepspeed_config = str(path)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4 is set by mmrl"):
        parallel.deepspeed_config(cfg, world=2)
    cfg.train.deepspeed_config = str(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        parallel.deepspeed_config(cfg, world=2)


def test_deepspeed_config_from_accelerate_flags_without_a_file(cfg, monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "cpu")
    ds = parallel.deepspeed_config(cfg, world=2)
    assert ds["zero_optimization"] == {"stage": 3, "offload_param": {"device": "cpu"}}


def test_sharded_strategies_refuse_what_they_cannot_run(cfg, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    cfg.model.lora.r = 8
    with pytest.raises(ValueError, match="use ddp or ZeRO-2"):
        parallel.make(cfg, parallel.dist.DistInfo())
    cfg.model.lora.r, cfg.sft.steps = 0, 10
    with pytest.raises(ValueError, match="SFT warm-up runs with train.parallel=ddp"):
        parallel.make(cfg, parallel.dist.DistInfo())


def test_zero3_refuses_token_budget_micro_batches_on_several_processes(cfg, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    cfg.sft.steps, cfg.train.max_tokens_per_micro_batch = 0, 512
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch with DeepSpeed ZeRO-3 .*"
                                         "use FSDP2"):
        parallel.make(cfg, parallel.dist.DistInfo(world=2))
    assert parallel.make(cfg, parallel.dist.DistInfo()).stage == 3  # one process: no record


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_audio"])
def test_touching_encoders_leaves_the_forward_unchanged(family):
    """A micro-batch without media, with the toucher on: the same logits, and every encoder
    parameter gets a gradient of exactly zero (it ran, as the other ranks' did)."""
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0)
    sample = Sample(id="t", messages=[{"role": "user", "content": [{"type": "text",
                                                                     "text": "Say a number"}]}])
    inputs = collate([adapter.prompt_features(processor, sample)],
                     pad_id=processor.tokenizer.pad_token_id)
    plain = model(**inputs).logits
    touch = TowerToucher(model, Codec(adapter, processor))
    with touch():
        touched = model(**inputs).logits
    assert torch.equal(plain, touched)
    touched.float().sum().backward()
    parts = ("vision",) if family != "qwen2_audio" else ("audio", "projector")
    prefixes = tuple(adapter.module_prefixes[k] for k in parts)
    tower = [(n, p) for n, p in model.named_parameters()
             if n.startswith(prefixes) and p.requires_grad]
    assert tower and all(p.grad is not None and not p.grad.any() for _, p in tower)
    model.zero_grad(set_to_none=True)
    model(**inputs).logits.float().sum().backward()  # outside the context: hooks are inert
    assert all(p.grad is None for _, p in tower)
