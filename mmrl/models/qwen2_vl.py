"""Qwen2-VL: image + video, M-RoPE positions from `mm_token_type_ids`.

Also the shared base for Qwen2.5-VL, which differs only in its vision tower config (windowed
attention, gated MLP) and in returning `second_per_grid_ts` for videos.
"""
from __future__ import annotations

from mmrl.models.base import ModelAdapter, _transformers_attr, tiny_text_config

# Geometry shared by the vision tower and the image/video processors: one value, two places.
GEOMETRY_KEYS = ("patch_size", "spatial_merge_size", "temporal_patch_size")


def mrope_sections(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies into (temporal, height, width) like Qwen's [16, 24, 24]
    for head_dim 128: a quarter to time, the rest shared by height and width."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


class Qwen2VLAdapter(ModelAdapter):
    family = "qwen2_vl"
    box_coords = "norm1000"
    model_class = "Qwen2VLForConditionalGeneration"
    processor_class = "Qwen2VLProcessor"
    config_class = "Qwen2VLConfig"
    video_processor_class = "Qwen2VLVideoProcessor"
    vllm_video = True
    trainer_rope = ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel")
    media_keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    media_kinds = ("images", "videos")
    placeholder_attrs = ("image_token", "video_token", "vision_start_token", "vision_end_token",
                         "vision_pad_token")
    processor_override_keys = ("min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels")
    # transformers 5.x names (4.x checkpoints' `visual.*` / `model.*` are renamed on load).
    # "vision" includes the merger (the projector into the LM), which "projector" names alone.
    module_prefixes = {"vision": "model.visual.", "projector": "model.visual.merger.",
                       "language": "model.language_model."}

    def tiny_text_config(self, tokenizer) -> dict:
        return tiny_text_config(tokenizer)

    def tiny_vision_config(self) -> dict:
        return dict(depth=2, embed_dim=64, num_heads=4, mlp_ratio=2, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2)

    def tiny_model_config(self, tokenizer, **overrides):
        text, vision = self.tiny_text_config(tokenizer), self.tiny_vision_config()
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        for key, value in overrides.items():
            if key.startswith("vision_"):
                self._set_vision(vision, key[len("vision_"):], value)
            elif key in GEOMETRY_KEYS:
                vision[key] = value
            elif key in ("rope_theta", "mrope_section"):
                rope[key] = value
            elif key in text:
                text[key] = value
            else:
                cfg = _transformers_attr(self.config_class).sub_configs["text_config"]
                if key not in getattr(cfg, "__dataclass_fields__", {}) and not hasattr(cfg, key):
                    raise TypeError(f"{self.family}.tiny(): unknown override {key!r}")
                text[key] = value
        head_dim = text["hidden_size"] // text["num_attention_heads"]
        rope.setdefault("mrope_section", mrope_sections(head_dim))
        if sum(rope["mrope_section"]) != head_dim // 2:
            raise ValueError(f"mrope_section {rope['mrope_section']} must sum to head_dim/2 = {head_dim // 2}")
        text["rope_parameters"] = rope
        self._finish_vision(vision, text)
        tokens = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
            ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
        return _transformers_attr(self.config_class)(
            text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"],
            **tokens)

    def _set_vision(self, vision: dict, key: str, value) -> None:
        if key == "hidden_size":
            vision["embed_dim"] = value
        elif key == "intermediate_size":  # Qwen2-VL sizes its MLP by ratio
            vision["mlp_ratio"] = value / vision["embed_dim"]
        else:
            vision[key] = value

    def _finish_vision(self, vision: dict, text: dict) -> None:
        # Qwen2-VL's vision `hidden_size` is the merger's output width: it must be the text width.
        vision["hidden_size"] = text["hidden_size"]

    def tiny_processor(self, tokenizer, config, *, min_pixels: int = 28 * 28 * 4,
                       max_pixels: int = 28 * 28 * 256, video_min_pixels: int | None = None,
                       video_max_pixels: int | None = None):
        """Image budget 4..256 merged tokens per image by default; videos default to the same
        per-frame budget (the class default, 128..768 tokens per frame, is far too big here)."""
        v = config.vision_config
        geometry = dict(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                        merge_size=v.spatial_merge_size)
        image_processor = _transformers_attr("Qwen2VLImageProcessor")(
            size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, **geometry)
        video_processor = _transformers_attr(self.video_processor_class)(
            size={"shortest_edge": video_min_pixels or min_pixels,
                  "longest_edge": video_max_pixels or max_pixels},
            cap_pixels_per_frame=True, **geometry)
        return _transformers_attr(self.processor_class)(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
            chat_template=tokenizer.chat_template)
