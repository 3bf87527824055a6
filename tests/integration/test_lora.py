"""LoRA: only adapters train (encoders excluded), the reference is the adapter-disabled model,
checkpoints hold adapters only and resume, and the merged export equals the adapted model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl import config
from mmrl.models import get_adapter
from mmrl.train import checkpoint
from mmrl.train.run import train

pytestmark = pytest.mark.integration


@pytest.fixture
def cfg_path(tiny_config, tmp_path) -> Path:
    return tiny_config(tmp_path / "lora.yaml", tmp_path / "data", name="lora",
                       model={"family": "qwen2_vl", "lora": {"r": 4, "alpha": 8}},
                       algo={"beta": 0.04}, train={"lr": 1.0e-2, "save_every": 1})


def test_lora_trains_adapters_only_and_exports(cfg_path, tmp_path):
    run_dir = tmp_path / "run"
    cfg = config.load(cfg_path, [f"log.run_dir={run_dir}"])
    summary = train(cfg)
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # lora_B starts at zero: at step 1 policy == reference exactly, so the KL is exactly 0;
    # after an update it is not.
    assert rows[0]["loss/kl"] == 0.0 and rows[1]["loss/kl"] > 0.0
    ckpt = checkpoint.latest(run_dir)
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    from safetensors.torch import load_file

    adapters = load_file(ckpt / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert not any("visual" in k for k in adapters), "vision tower must be excluded by default"
    # Merged export = base + adapters: same logits as the adapted model, no peft needed to load.
    adapter = get_adapter("qwen2_vl")
    merged, processor = adapter.load(summary["merged_model"])
    base, _ = adapter.tiny(seed=0, min_pixels=3136, max_pixels=3136)
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(base, str(ckpt))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        a = adapted(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids)).logits
        b = merged(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids)).logits
    assert torch.allclose(a, b, atol=1e-5)
    base_fresh, _ = adapter.tiny(seed=0, min_pixels=3136, max_pixels=3136)
    with torch.no_grad():
        c = base_fresh(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids)).logits
    assert not torch.allclose(a, c, atol=1e-4), "adapters did not change the model"


def test_lora_checkpoint_resumes(cfg_path, tmp_path):
    run_dir = tmp_path / "run"
    train(config.load(cfg_path, [f"log.run_dir={run_dir}", "train.steps=1"]))
    summary = train(config.load(cfg_path, [f"log.run_dir={run_dir}", "train.steps=2",
                                           "train.resume=auto"]))
    assert summary["steps"] == 2 and checkpoint.latest(run_dir).name == "step_000002"
