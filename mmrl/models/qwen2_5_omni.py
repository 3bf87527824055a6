"""Qwen2.5-Omni, text output only: the Thinker (audio encoder + Qwen2.5-VL-style vision encoder +
M-RoPE LM). The Talker and Token2Wav (speech output) are never loaded.

Differences from Qwen2.5-VL that matter here:
- placeholders are `<|IMAGE|>` `<|VIDEO|>` `<|AUDIO|>` inside `<|vision_bos|>..<|vision_eos|>` /
  `<|audio_bos|>..<|audio_eos|>`; the model finds media spans by the token after
  `vision_start_token_id` (= `<|vision_bos|>`'s id), so the chat template must emit exactly these;
- positions come from input_ids + grids inside the model (no `mm_token_type_ids`; generate()
  rejects it); video time runs at `position_id_per_seconds` (25) ids per second, so
  `video_second_per_grid` (temporal_patch_size / sampling fps) must be right;
- the 5.19 processor computes `video_second_per_grid` from ONE `fps` processor kwarg (default 2.0,
  whatever the metadata says); `prompt_features` overwrites it per video from each video's fps.

Real checkpoints (Qwen/Qwen2.5-Omni-3B/7B) are full Omni models: config.json has
`thinker_config`, weights are stored under `thinker.`. `Qwen2_5OmniThinkerForConditionalGeneration.
from_pretrained` on such a directory picks `thinker_config` (it matches the thinker's model_type)
and strips the `thinker.` prefix (the class's base_model_prefix); talker/token2wav weights are
skipped as unexpected keys. A unit test checks this on a tiny checkpoint written in that layout.
"""
from __future__ import annotations

import torch

from mmrl.models.base import _transformers_attr, set_override, tiny_text_config
from mmrl.models.qwen2_5_vl import Qwen2_5_VLAdapter
from mmrl.models.qwen2_audio import AUDIO_ALIASES, whisper_features
from mmrl.models.qwen2_vl import GEOMETRY_KEYS, mrope_sections
from mmrl.models.tiny_tokenizer import CHAT_TEMPLATE

# The tiny tokenizer's template with Omni's placeholders; still dispatching on content['type'] only.
OMNI_CHAT_TEMPLATE = (
    CHAT_TEMPLATE
    .replace("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_bos|><|IMAGE|><|vision_eos|>")
    .replace("<|vision_start|><|video_pad|><|vision_end|>", "<|vision_bos|><|VIDEO|><|vision_eos|>")
)
assert "<|IMAGE|>" in OMNI_CHAT_TEMPLATE and "<|VIDEO|>" in OMNI_CHAT_TEMPLATE


class Qwen2_5OmniAdapter(Qwen2_5_VLAdapter):
    family = "qwen2_5_omni"
    model_class = "Qwen2_5OmniThinkerForConditionalGeneration"
    processor_class = "Qwen2_5OmniProcessor"
    config_class = "Qwen2_5OmniThinkerConfig"
    vllm_video = False
    vllm_video_refused = ("vLLM's Qwen2.5-Omni processor expands a video to another size than the "
                          "trainer's (4 frames of 56 px: about 280 tokens against 8), so the prompt "
                          "check fails")
    trainer_rope = None  # the thinker's model_type had no entry in the worker's old table
    media_keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                  "video_second_per_grid", "input_features", "feature_attention_mask")
    media_kinds = ("images", "videos", "audios")
    placeholder_attrs = ("image_token", "video_token", "audio_token", "vision_bos_token",
                         "vision_eos_token", "audio_bos_token", "audio_eos_token")
    processor_override_keys = Qwen2_5_VLAdapter.processor_override_keys + ("chunk_length",)
    uses_token_type_ids = False
    # The thinker holds its parts at the top level (no `model.` wrapper around the towers).
    module_prefixes = {"vision": "visual.", "audio": "audio_tower.", "language": "model."}

    def tiny_audio_config(self, text_hidden: int) -> dict:
        return dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                    d_model=64, max_source_positions=1500, n_window=100, output_dim=text_hidden)

    def tiny_model_config(self, tokenizer, **overrides):
        """Overrides: text keys, `vision_<key>`, `audio_<key>`, rope_theta / mrope_section."""
        text, vision = tiny_text_config(tokenizer), self.tiny_vision_config()
        vision.pop("tokens_per_second")  # Omni times videos by position_id_per_seconds instead
        audio_overrides, rope = {}, {"rope_type": "default", "rope_theta": 10000.0}
        text_cls = _transformers_attr("Qwen2_5OmniTextConfig")
        for key, value in overrides.items():
            if key.startswith("vision_"):
                set_override(self.family, vision, key[len("vision_"):], value,
                             _transformers_attr("Qwen2_5OmniVisionEncoderConfig"))
            elif key in GEOMETRY_KEYS:
                vision[key] = value
            elif key.startswith("audio_"):
                audio_overrides[key[len("audio_"):]] = value
            elif key in ("rope_theta", "mrope_section"):
                rope[key] = value
            else:
                set_override(self.family, text, key, value, text_cls)
        audio = self.tiny_audio_config(text["hidden_size"])
        for key, value in audio_overrides.items():
            set_override(self.family, audio, key, value,
                         _transformers_attr("Qwen2_5OmniAudioEncoderConfig"), AUDIO_ALIASES)
        head_dim = text["hidden_size"] // text["num_attention_heads"]
        rope.setdefault("mrope_section", mrope_sections(head_dim))
        if sum(rope["mrope_section"]) != head_dim // 2:
            raise ValueError(f"mrope_section {rope['mrope_section']} must sum to head_dim/2 = {head_dim // 2}")
        text["rope_parameters"] = rope
        vision["out_hidden_size"] = text["hidden_size"]
        vision.setdefault("fullatt_block_indexes", [vision["depth"] - 1])
        ids = tokenizer.convert_tokens_to_ids
        return _transformers_attr(self.config_class)(
            text_config=text, vision_config=vision, audio_config=audio,
            image_token_index=ids("<|IMAGE|>"), video_token_index=ids("<|VIDEO|>"),
            audio_token_index=ids("<|AUDIO|>"), audio_start_token_id=ids("<|audio_bos|>"),
            audio_end_token_id=ids("<|audio_eos|>"), vision_start_token_id=ids("<|vision_bos|>"),
            vision_end_token_id=ids("<|vision_eos|>"), user_token_id=ids("user"),
            tie_word_embeddings=False)

    def tiny_processor(self, tokenizer, config, *, min_pixels: int = 28 * 28 * 4,
                       max_pixels: int = 28 * 28 * 256, video_min_pixels: int | None = None,
                       video_max_pixels: int | None = None, chunk_length: int = 5):
        """Qwen2.5-VL's budgets, plus `chunk_length` seconds of audio per window (default 5)."""
        # The Omni processor reads its pads from the tokenizer's named tokens.
        tokenizer.image_token, tokenizer.video_token = "<|IMAGE|>", "<|VIDEO|>"
        tokenizer.chat_template = OMNI_CHAT_TEMPLATE
        v = config.vision_config
        geometry = dict(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                        merge_size=v.spatial_merge_size)
        image_processor = _transformers_attr("Qwen2VLImageProcessor")(
            size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, **geometry)
        video_processor = _transformers_attr("Qwen2VLVideoProcessor")(
            size={"shortest_edge": video_min_pixels or min_pixels,
                  "longest_edge": video_max_pixels or max_pixels},
            cap_pixels_per_frame=True, **geometry)
        return _transformers_attr(self.processor_class)(
            image_processor=image_processor, video_processor=video_processor,
            feature_extractor=whisper_features(chunk_length), tokenizer=tokenizer,
            chat_template=OMNI_CHAT_TEMPLATE)

    def processor_media_kwargs(self, processor, images, videos, audios,
                               video_fps=None) -> tuple[dict, dict]:
        kwargs, fixups = super().processor_media_kwargs(processor, images, videos, audios, video_fps)
        if videos:
            # The Omni processor's class defaults (128..768 tokens a frame) outrank the video
            # processor's own `size`: pass the video processor's budget explicitly.
            size = processor.video_processor.size
            kwargs["videos_kwargs"] = {"size": {k: size[k] for k in ("shortest_edge", "longest_edge")}}
            # One `video_second_per_grid` per video from its own fps (the processor would use a
            # single `fps` kwarg, default 2.0, for all). Placeholder counts do not depend on it.
            temporal = processor.video_processor.temporal_patch_size
            fixups["video_second_per_grid"] = torch.tensor(
                [temporal / meta["fps"] for meta in kwargs["video_metadata"]])
        return kwargs, fixups
