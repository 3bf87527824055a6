"""The trainer asks engines and strategies what they do (attributes), never which one they are:
each must say it, with the value the trainer's stages rely on."""
from __future__ import annotations

from mmrl.rollout.base import RolloutEngine
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.vllm import VLLMEngine
from mmrl.rollout.vllm_server import VLLMServerEngine
from mmrl.train import parallel


def test_engines_say_whether_they_sample_from_the_training_model():
    # HF generates with the training model: weights gathered while it runs, never synced.
    assert HFEngine.samples_from_training_model is True
    # vLLM holds its own copy: synced after every update (test_vllm_train proves the sync).
    assert VLLMEngine.samples_from_training_model is False
    assert VLLMServerEngine.samples_from_training_model is False
    assert "samples_from_training_model" in RolloutEngine.__annotations__


def test_strategies_say_whether_they_place_the_model():
    assert parallel.DDP.places_model is False  # the learner moves the model to its device
    assert parallel.DeepSpeed.places_model is True  # deepspeed.initialize does
    assert parallel.FSDP2.places_model is True  # fully_shard does


def test_strategies_say_whether_they_run_the_sft_warm_up():
    # sft.py steps a plain replicated model; a sharded one would need its own SFT step.
    assert parallel.DDP.runs_sft is True
    assert parallel.DeepSpeed.runs_sft is False
    assert parallel.FSDP2.runs_sft is False


def test_adapters_say_their_image_factor():
    """Image budgets round to patch size x merge: 16 px x 2 for Qwen3-VL, 14 px x 2 before."""
    from mmrl.models import get_adapter

    assert get_adapter("qwen3_vl").image_factor == 32
    assert get_adapter("qwen2_5_vl").image_factor == get_adapter("qwen2_vl").image_factor == 28
