"""Real-shape builders: parameter counts equal the published checkpoints' sizes (built on the meta
device: no memory), layer reduction keeps widths and tower index lists valid, and
`model.path: shape:NAME` builds through the trainer's model setup."""
from __future__ import annotations

import pytest
import torch

from mmrl.models import shapes


def _count(model, prefix: str = "") -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))


@pytest.fixture(scope="module")
def built():
    return {name: shapes.build(name, device="meta") for name in shapes.SHAPES}


@pytest.mark.parametrize("name", [n for n, s in shapes.SHAPES.items() if s.params])
def test_parameter_count_equals_the_published_size(built, name):
    model, _ = built[name]
    assert _count(model) == pytest.approx(shapes.SHAPES[name].params, rel=0.01)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_omni_thinker_parts_equal_their_published_models(built):
    """The thinker has no published size of its own; its LM is Qwen2.5-7B (7.61B on its card),
    LM + vision tower is Qwen2.5-VL-7B (8.29B), its audio encoder Qwen2-Audio's."""
    omni, _ = built["qwen2_5_omni-7b"]
    lm = _count(omni, "model.") + _count(omni, "lm_head.")
    assert lm == pytest.approx(7.61e9, rel=0.01)
    assert lm + _count(omni, "visual.") == pytest.approx(8.29e9, rel=0.01)
    audio, _ = built["qwen2_audio-7b"]
    whisper = _count(audio, "model.audio_tower.") + _count(audio, "model.multi_modal_projector.")
    assert _count(omni, "audio_tower.") == pytest.approx(whisper, rel=0.01)


def test_real_vocabulary_size_and_geometry(built):
    model, processor = built["qwen2_5_vl-7b"]
    assert model.lm_head.weight.shape == (152064, 3584)
    assert processor.image_processor.patch_size == 14 and processor.image_processor.merge_size == 2
    model3, processor3 = built["qwen3_vl-8b"]
    assert processor3.image_processor.patch_size == 16
    assert model3.config.text_config.rope_parameters["mrope_section"] == [24, 20, 20]
    # Tied embeddings where the checkpoint ties them (the 3B and 4B models).
    small, _ = built["qwen2_5_vl-3b"]
    assert small.lm_head.weight is small.model.language_model.embed_tokens.weight


def test_fewer_layers_keep_widths_and_scale_tower_depth():
    d = shapes.dims("qwen2_5_vl-7b", layers=7)  # a quarter of 28
    assert d["num_hidden_layers"] == 7 and d["hidden_size"] == 3584
    assert d["vision_depth"] == 8 and d["vision_fullatt_block_indexes"] == [1, 3, 5, 7]
    q3 = shapes.dims("qwen3_vl-8b", layers=12)  # a third of 36: 27 -> 9 blocks
    assert q3["vision_depth"] == 9 and q3["vision_deepstack_visual_indexes"] == [2, 5, 7]
    one = shapes.dims("qwen2_audio-7b", layers=1)
    assert one["audio_encoder_layers"] == 1
    model, _ = shapes.build("qwen3_vl-8b", layers=12, device="meta")
    assert len(model.model.language_model.layers) == 12 and len(model.model.visual.blocks) == 9


@pytest.mark.parametrize("path, message", [
    ("shape:qwen9-1b", "unknown shape"), ("shape:qwen2_5_vl-7b:29", "LAYERS must be 1..28"),
    ("shape:qwen2_5_vl-7b:x", "LAYERS must be")])
def test_bad_shape_paths_say_what_is_allowed(path, message):
    with pytest.raises(ValueError, match=message):
        shapes.parse(path)


def test_model_path_shape_builds_through_the_trainer_setup():
    """`model.path: shape:...` in a config: check_environment accepts it offline, build_model
    returns the real class at the real width (1 layer, bf16), and a family mismatch is an error."""
    from mmrl import config
    from mmrl.models import get_adapter
    from mmrl.train import setup

    cfg = config.load(None, ["data.train=x.jsonl", "model.family=qwen2_5_vl",
                             "model.path=shape:qwen2_5_vl-3b:1",
                             "model.dtype=bfloat16"])
    setup.check_environment(cfg)
    model, processor, peft = setup.build_model(cfg, get_adapter("qwen2_5_vl"))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration" and peft is None
    assert model.lm_head.weight.shape == (151936, 2048) and model.dtype == torch.bfloat16
    assert len(model.model.language_model.layers) == 1
    wrong = config.load(None, ["data.train=x.jsonl", "model.family=qwen2_vl",
                               "model.path=shape:qwen2_5_vl-3b:1"])
    with pytest.raises(ValueError, match="set model.family=qwen2_5_vl"):
        setup.build_model(wrong, get_adapter("qwen2_vl"))
