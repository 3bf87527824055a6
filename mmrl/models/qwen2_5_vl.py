"""Qwen2.5-VL: Qwen2-VL's text side and processors; a windowed-attention vision tower with a
gated MLP, and `second_per_grid_ts` (seconds per temporal patch) for videos' M-RoPE time axis."""
from __future__ import annotations

from mmrl.models.qwen2_vl import Qwen2VLAdapter


class Qwen2_5_VLAdapter(Qwen2VLAdapter):
    family = "qwen2_5_vl"
    box_coords = "resized"
    model_class = "Qwen2_5_VLForConditionalGeneration"
    processor_class = "Qwen2_5_VLProcessor"
    config_class = "Qwen2_5_VLConfig"
    vllm_video = True
    trainer_rope = ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel")
    media_keys = Qwen2VLAdapter.media_keys + ("second_per_grid_ts",)

    def tiny_vision_config(self) -> dict:
        # window_size 112 px = 4 merged tokens a side; the last block attends globally, as in
        # the real model (full attention every 8th block).
        return dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                    tokens_per_second=2)

    def _set_vision(self, vision: dict, key: str, value) -> None:
        vision[key] = value

    def _finish_vision(self, vision: dict, text: dict) -> None:
        vision["out_hidden_size"] = text["hidden_size"]
        vision.setdefault("fullatt_block_indexes", [vision["depth"] - 1])
