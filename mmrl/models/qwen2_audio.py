"""Qwen2-Audio: a Whisper-style audio encoder + projector in front of a Qwen2 LM (1-D RoPE).

Audio enters as 128-bin log-mel `input_features` [n_audios, 128, frames] padded to the feature
extractor's full window, with `feature_attention_mask` [n_audios, frames] marking real frames;
each audio becomes `<|audio_bos|>` + one `<|AUDIO|>` per 40 ms of real audio + `<|audio_eos|>`.
The encoder insists on exactly `max_source_positions * 2` mel frames, so the window length
(`chunk_length` seconds, 30 for the real model) is one value that the feature extractor and the
encoder config must share; tiny() derives one from the other.
"""
from __future__ import annotations

from mmrl.models.base import ModelAdapter, _transformers_attr, set_override, tiny_text_config
from mmrl.models.tiny_tokenizer import CHAT_TEMPLATE

# Whisper front end: 100 mel frames per second; the encoder's stride-2 conv halves them.
MEL_FRAMES_PER_SECOND = 100
AUDIO_ALIASES = {"hidden_size": "d_model", "num_hidden_layers": "encoder_layers",
                 "num_attention_heads": "encoder_attention_heads",
                 "intermediate_size": "encoder_ffn_dim"}


def whisper_features(chunk_length: int):
    """A 128-bin, 16 kHz WhisperFeatureExtractor padding/truncating to `chunk_length` seconds."""
    return _transformers_attr("WhisperFeatureExtractor")(
        feature_size=128, sampling_rate=16000, chunk_length=chunk_length, hop_length=160, n_fft=400)


class Qwen2AudioAdapter(ModelAdapter):
    family = "qwen2_audio"
    # AutoModelForMultimodalLM resolves to the same class (AutoModelForImageTextToText rejects
    # Qwen2AudioConfig); the 5.19 class renames hub keys (language_model.model.* ->
    # model.language_model.*) on load.
    model_class = "Qwen2AudioForConditionalGeneration"
    processor_class = "Qwen2AudioProcessor"
    config_class = "Qwen2AudioConfig"
    media_keys = ("input_features", "feature_attention_mask")
    media_kinds = ("audios",)
    placeholder_attrs = ("audio_token", "audio_bos_token", "audio_eos_token")
    processor_override_keys = ()
    uses_token_type_ids = False  # 1-D RoPE; generate() rejects the key
    vllm_video = False  # no video
    trainer_rope = None  # 1-D RoPE: vLLM's positions are the trainer's
    module_prefixes = {"audio": "model.audio_tower.", "projector": "model.multi_modal_projector.",
                       "language": "model.language_model."}

    def tiny_audio_config(self) -> dict:
        return dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4,
                    encoder_ffn_dim=128, d_model=64, max_source_positions=5 * MEL_FRAMES_PER_SECOND // 2)

    def tiny_model_config(self, tokenizer, **overrides):
        """Overrides: text keys, `audio_<key>` for the encoder, and `chunk_length` (seconds of
        audio per window, default 5: six times cheaper than the real model's 30)."""
        text, audio = tiny_text_config(tokenizer), self.tiny_audio_config()
        text_cls = _transformers_attr("Qwen2Config")
        audio_cls = _transformers_attr("Qwen2AudioEncoderConfig")
        for key, value in overrides.items():
            if key == "chunk_length":
                audio["max_source_positions"] = int(value) * MEL_FRAMES_PER_SECOND // 2
            elif key.startswith("audio_"):
                set_override(self.family, audio, key[len("audio_"):], value, audio_cls, AUDIO_ALIASES)
            else:
                set_override(self.family, text, key, value, text_cls)
        return _transformers_attr(self.config_class)(
            text_config=dict(text, model_type="qwen2"), audio_config=audio,
            audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"))

    def tiny_processor(self, tokenizer, config, **overrides):
        chunk = config.audio_config.max_source_positions * 2 // MEL_FRAMES_PER_SECOND
        return _transformers_attr(self.processor_class)(
            feature_extractor=whisper_features(chunk), tokenizer=tokenizer,
            chat_template=CHAT_TEMPLATE)
