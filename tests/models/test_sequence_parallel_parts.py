"""The single-process parts of sequence parallelism: media units (a video split along time
encodes to the same embeddings), balanced shares, the head checks, what `install` refuses,
and the config rules of train.sequence_parallel. The 2-process equality test is
tests/integration/test_sequence_parallel.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl import config, config_rules
from mmrl.models import get_adapter, ulysses
from mmrl.models.media_embeds import (balanced_ranges, encode, kind_tensors, media_units, owner_of,
                                      select_units)
from mmrl.models.shared_prefix import attn_implementation
from mmrl.types import Sample


@pytest.fixture(scope="module")
def vl():
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=1)
    frames = [np.random.default_rng(i).integers(0, 256, (t, 56, 84, 3), dtype=np.uint8)
              for i, t in enumerate((6, 4))]
    sample = Sample(id="v", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "video"}, {"type": "video"}, {"type": "text", "text": "?"}]}])
    prompt = adapter.prompt_features(processor, sample, [Image.new("RGB", (56, 56), "red")],
                                     videos=frames, video_fps=2.0)
    return model, prompt


def test_video_split_along_time_encodes_to_the_same_embeddings(vl):
    model, prompt = vl
    owner = owner_of(model)
    tensors = kind_tensors(prompt.tensors, "videos")
    units = media_units("videos", tensors)
    assert [(u.item, u.t0) for u in units] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    with torch.no_grad():
        whole = encode(owner, "videos", tensors)
        # Ranks' shares: [video 0 frames 0-3], [video 0 frames 4-5 + video 1].
        parts = [encode(owner, "videos", select_units("videos", tensors, units[a:b]))
                 for a, b in ((0, 2), (2, 5))]
    assert select_units("videos", tensors, units[2:5])["video_grid_thw"].tolist() == [[1, 4, 6], [2, 4, 6]]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6, rtol=0)


def test_balanced_ranges_are_contiguous_and_even():
    assert balanced_ranges([1] * 6, 2) == [(0, 3), (3, 6)]
    assert balanced_ranges([10, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert balanced_ranges([5], 2) == [(0, 0), (0, 1)]  # one unit: one rank gets none
    assert balanced_ranges([], 3) == [(0, 0), (0, 0), (0, 0)]
    shares = balanced_ranges([3, 1, 4, 1, 5, 9, 2, 6], 4)
    assert shares[0][0] == 0 and shares[-1][1] == 8
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))


def test_audio_units_are_whole_audios():
    mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 8])
    units = media_units("audios", {"input_features": torch.zeros(2, 4, 8), "feature_attention_mask": mask})
    assert [(u.item, u.cost) for u in units] == [(0, 5), (1, 8)]
    picked = select_units("audios", {"input_features": torch.arange(16.).view(2, 1, 8),
                                     "feature_attention_mask": mask}, units[1:])
    assert picked["input_features"].flatten().tolist() == list(range(8, 16))


@pytest.mark.parametrize("heads, kv, size, ok", [
    (4, 2, 2, True), (4, 1, 2, True), (4, 1, 4, True), (8, 2, 4, True),
    (4, 2, 3, False), (6, 4, 3, False), (12, 3, 2, False)])
def test_heads_split_or_repeat_else_clear_error(heads, kv, size, ok):
    adapter = get_adapter("qwen2_audio")
    model, _ = adapter.tiny(seed=0, num_hidden_layers=1, hidden_size=heads * 16,
                            num_attention_heads=heads, num_key_value_heads=kv)
    if ok:
        ulysses.check_heads(model, size)
    else:
        with pytest.raises(ValueError, match=f"train.sequence_parallel={size}: the model has"):
            ulysses.check_heads(model, size)


def test_install_keeps_the_inner_kernel_visible_and_refuses_flash(vl):
    model, _ = vl
    try:
        ulysses.install(model, ulysses.SPGroup(None, 0, 2))
        assert model.config.text_config._attn_implementation == "mmrl_ulysses_sdpa"
        assert model.config.vision_config._attn_implementation == "sdpa"  # towers untouched
        assert attn_implementation(model) == "sdpa"  # the layout still sees its kernel
    finally:
        model.model.language_model.set_attn_implementation("sdpa")
        ulysses.install(model, ulysses.SPGroup())
    model.config.text_config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="train.shared_prefix=true"):
            ulysses.install(model, ulysses.SPGroup(None, 0, 2))
    finally:
        model.config.text_config._attn_implementation = "sdpa"
        ulysses.install(model, ulysses.SPGroup())


def test_config_rules_for_sequence_parallel():
    cfg = config.RunConfig()
    cfg.rollout.prompts_per_step = 8
    cfg.train.sequence_parallel = 4
    assert config_rules.problems(cfg, world=8) == []  # 2 data-parallel ranks x 4
    assert config_rules.problems(cfg, world=6) == [
        "train.sequence_parallel=4: must divide the process count 6"]
    cfg.rollout.prompts_per_step = 4  # each process samples whole groups of its sequence group's
    assert config_rules.problems(cfg, world=8) == [
        "rollout.prompts_per_step=4: must be divisible by the process count 8"]
    cfg.rollout.prompts_per_step = 8
    cfg.rollout.backend = "vllm"
    assert config_rules.problems(cfg, world=8) == [
        "train.sequence_parallel=4 with rollout.backend=vllm: not verified yet (the split rollout "
        "is tested with the training model's own generate); use rollout.backend=hf"]
    cfg.rollout.backend = "hf"
    cfg.model.attn_implementation, cfg.train.shared_prefix = "flash_attention_2", False
    assert "needs train.shared_prefix=true" in config_rules.problems(cfg, world=8)[0]
    cfg.train.sequence_parallel, cfg.train.max_tokens_per_micro_batch = 0, 0
    assert set(config_rules.problems(cfg, world=1)) == {
        "train.sequence_parallel=0: must be >= 1 (1 = off)",
        "train.max_tokens_per_micro_batch=0: must be >= 1 or null"}
