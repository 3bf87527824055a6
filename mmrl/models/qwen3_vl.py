"""Qwen3-VL (dense): Qwen2-VL's tokens and M-RoPE inputs (`mm_token_type_ids`), with
- a 16-px patch vision tower with learned position embeddings and DeepStack (features of
  `deepstack_visual_indexes` blocks are added into the first LM layers),
- interleaved M-RoPE (`mrope_section` still sums to head_dim/2) and an explicit `head_dim`,
- videos timed by text: the processor writes `<t seconds>` before each temporal patch's frame
  tokens, computed from the video metadata's `frames_indices / fps` (no second_per_grid_ts).
  `prompt_features` passes each video's real timestamps through that metadata, so the times the
  model reads are seconds from the file start (what temporal-grounding answers are scored in).
"""
from __future__ import annotations

from mmrl.models.base import _transformers_attr, set_override, tiny_text_config, video_metadata
from mmrl.models.qwen2_vl import GEOMETRY_KEYS, Qwen2VLAdapter, mrope_sections


class Qwen3VLAdapter(Qwen2VLAdapter):
    family = "qwen3_vl"
    box_coords = "norm1000"
    image_factor = 32  # 16 px patches, merged 2x2
    model_class = "Qwen3VLForConditionalGeneration"
    processor_class = "Qwen3VLProcessor"
    config_class = "Qwen3VLConfig"
    video_processor_class = "Qwen3VLVideoProcessor"
    vllm_video = False
    vllm_video_refused = ("vLLM expands Qwen3-VL's timestamped video prompt to the trainer's ids, "
                          "but its logprobs after a video are 0.05-0.12 off the trainer's forward")
    trainer_rope = None  # vLLM's Qwen3-VL positions already match (tests/integration/test_vllm.py)
    media_keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")

    def tiny_vision_config(self) -> dict:
        # 8x8 learned position grid (interpolated to each image's patch grid); DeepStack from block 0.
        return dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                    deepstack_visual_indexes=[0])

    def tiny_model_config(self, tokenizer, **overrides):
        text, vision = tiny_text_config(tokenizer), self.tiny_vision_config()
        text["head_dim"] = text["hidden_size"] // text["num_attention_heads"]
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True}
        text_cls = _transformers_attr("Qwen3VLTextConfig")
        for key, value in overrides.items():
            if key.startswith("vision_"):
                set_override(self.family, vision, key[len("vision_"):], value,
                             _transformers_attr("Qwen3VLVisionConfig"))
            elif key in GEOMETRY_KEYS:
                vision[key] = value
            elif key in ("rope_theta", "mrope_section"):
                rope[key] = value
            else:
                set_override(self.family, text, key, value, text_cls)
                if key in ("hidden_size", "num_attention_heads") and "head_dim" not in overrides:
                    text["head_dim"] = text["hidden_size"] // text["num_attention_heads"]
        rope.setdefault("mrope_section", mrope_sections(text["head_dim"]))
        if sum(rope["mrope_section"]) != text["head_dim"] // 2:
            raise ValueError(f"mrope_section {rope['mrope_section']} must sum to head_dim/2 = {text['head_dim'] // 2}")
        text["rope_parameters"] = rope
        vision["out_hidden_size"] = text["hidden_size"]
        if any(i >= vision["depth"] for i in vision["deepstack_visual_indexes"]):
            vision["deepstack_visual_indexes"] = [vision["depth"] - 1]
        ids = tokenizer.convert_tokens_to_ids
        return _transformers_attr(self.config_class)(
            text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"],
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))

    def tiny_processor(self, tokenizer, config, *, min_pixels: int = 32 * 32 * 4,
                       max_pixels: int = 32 * 32 * 256, video_min_pixels: int | None = None,
                       video_max_pixels: int | None = None):
        """Budgets in 32x32-pixel merged tokens (16-px patches, 2x2 merge): 4..256 per image."""
        return super().tiny_processor(tokenizer, config, min_pixels=min_pixels, max_pixels=max_pixels,
                                      video_min_pixels=video_min_pixels,
                                      video_max_pixels=video_max_pixels)

    def processor_media_kwargs(self, processor, images, videos, audios,
                               video_fps=None) -> tuple[dict, dict]:
        kwargs, fixups = super().processor_media_kwargs(processor, images, videos, audios, video_fps)
        for i, video in enumerate(videos or ()):
            stamps = getattr(video, "timestamps", None)
            if stamps is not None and len(stamps) == len(kwargs["videos"][i]):
                # timestamp = frames_indices / fps: indices in units of the sampling interval.
                meta = video_metadata(kwargs["videos"][i], kwargs["video_metadata"][i]["fps"])
                meta["frames_indices"] = [t * meta["fps"] for t in stamps]
                kwargs["video_metadata"][i] = meta
        return kwargs, fixups
