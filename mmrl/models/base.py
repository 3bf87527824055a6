"""The model-family adapter: everything the trainer must know about one transformers family.

One instance per family, registered in `mmrl.models.MODELS`. The trainer never calls a processor
or names a placeholder token itself; it asks the adapter. transformers is imported lazily so that
`import mmrl.models` stays cheap (the CLI lists families without loading torch models).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from mmrl.types import PromptFeatures, Sample

# Token-aligned keys of a processor output ([1, P]); every other tensor is a media tensor that
# concatenates along dim 0 (pixel_values [patches, D], image_grid_thw [n_images, 3], ...).
TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")

# mm_token_type_ids values that transformers' get_rope_index expects: text 0, image 1, video 2
# (3 = audio in families that have it). See Qwen2VLModel.get_rope_index.
TOKEN_TYPE = {"image": 1, "video": 2, "audio": 3}


def _transformers_attr(name: str):
    import transformers

    return getattr(transformers, name)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


class ModelAdapter:
    """Base adapter; families set the class attributes and implement `tiny_model_config` /
    `tiny_processor`. Plain methods, no state besides the class attributes."""

    family: str = ""
    model_class: str = ""  # transformers class name
    processor_class: str = ""
    # Media tensors carried from the processor call into every forward (generation and training).
    media_keys: tuple[str, ...] = ()
    # Which keyword media lists `prompt_features` accepts ("images", "videos", "audios").
    media_kinds: tuple[str, ...] = ("images",)
    # Attribute names on the processor/tokenizer that name placeholder and boundary tokens.
    placeholder_attrs: tuple[str, ...] = ()
    # tiny() overrides that go to the processor instead of the model config.
    processor_override_keys: tuple[str, ...] = ("min_pixels", "max_pixels")

    # ---- loading ---------------------------------------------------------------------------

    def load(self, path: str, *, dtype: torch.dtype = torch.float32,
             attn_implementation: str = "sdpa", **processor_kwargs) -> tuple[Any, Any]:
        """(model, processor) from a hub-format checkpoint (local dir or hub id).

        A local dir, or HF_HUB_OFFLINE=1, never touches the network. `processor_kwargs` go to
        `AutoProcessor.from_pretrained` (e.g. min_pixels / max_pixels budgets).
        """
        local = os.path.isdir(path) or _offline()
        model = _transformers_attr(self.model_class).from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=local)
        processor = _transformers_attr("AutoProcessor").from_pretrained(
            path, local_files_only=local, **processor_kwargs)
        return model, processor

    def tiny(self, seed: int = 0, **overrides) -> tuple[Any, Any]:
        """A small random (model, processor), fully offline; same seed -> same weights bit-for-bit.

        Overrides: text config keys (hidden_size, num_hidden_layers, ...), `vision_<key>` for the
        vision tower (vision_depth, vision_hidden_size, ...), and processor budgets
        (min_pixels, max_pixels). Unknown keys raise TypeError.
        """
        from transformers import GenerationConfig

        from mmrl.models.tiny_tokenizer import tiny_tokenizer

        tokenizer = tiny_tokenizer()
        processor_keys = {k: overrides.pop(k) for k in list(overrides) if k in self.processor_override_keys}
        config = self.tiny_model_config(tokenizer, **overrides)
        processor = self.tiny_processor(tokenizer, config, **processor_keys)
        # fork_rng: building a tiny model must not move the caller's global RNG stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _transformers_attr(self.model_class)(config)
        model.eval()
        eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
        # Qwen's instruct checkpoints stop on both <|im_end|> and <|endoftext|>; mirror that.
        model.generation_config = GenerationConfig(
            eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
        return model, processor

    def tiny_model_config(self, tokenizer, **overrides):
        raise NotImplementedError

    def tiny_processor(self, tokenizer, config, **overrides):
        raise NotImplementedError

    # ---- prompts -----------------------------------------------------------------------------

    def prompt_features(self, processor, sample: Sample, images: list | None = None, *,
                        videos: list | None = None, audios: list | None = None,
                        **processor_kwargs) -> PromptFeatures:
        """The one processor call for `sample`, reused by rollout and every training forward.

        `images`: decoded PIL images in the order of the sample's image items; `videos`: frame
        lists/arrays; `audios`: 1-D float arrays. Families reject media kinds they cannot take.
        """
        media = {"images": images, "videos": videos, "audios": audios}
        for kind, items in media.items():
            if items and kind not in self.media_kinds:
                raise ValueError(f"{self.family}: cannot take {kind} (sample {sample.id!r}, {sample.source})")
        text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
        for kind, attr in (("images", "image_token"), ("videos", "video_token"), ("audios", "audio_token")):
            token = getattr(processor, attr, None)
            # Caught here, the mismatch names the sample; inside the processor it names nothing.
            if isinstance(token, str) and text.count(token) != len(media[kind] or ()):
                raise ValueError(f"sample {sample.id!r} ({sample.source}): {text.count(token)} {kind} "
                                 f"items in its messages but {len(media[kind] or ())} {kind} given")
        kwargs = {k: v for k, v in media.items() if v}
        out = processor(text=[text], return_tensors="pt", **kwargs, **processor_kwargs)
        tensors = {k: v if torch.is_tensor(v) else torch.as_tensor(v) for k, v in out.items()}
        if "mm_token_type_ids" not in tensors:
            tensors["mm_token_type_ids"] = self.token_type_ids(processor, tensors["input_ids"])
        tensors["mm_token_type_ids"] = tensors["mm_token_type_ids"].long()
        return PromptFeatures(sample=sample, tensors=tensors)

    def token_type_ids(self, processor, input_ids: torch.Tensor) -> torch.Tensor:
        """mm_token_type_ids from the pad tokens, for processors that do not return it."""
        types = torch.zeros_like(input_ids)
        for kind, value in TOKEN_TYPE.items():
            token_id = getattr(processor, f"{kind}_token_id", None)
            if token_id is not None:
                types[input_ids == token_id] = value
        return types

    def placeholder_token_ids(self, processor) -> list[int]:
        """Every media pad / boundary token id in this processor's vocabulary.

        Sampled, any of them breaks the next forward ("features and tokens do not match"), so
        rollouts suppress them and the training forward rejects them.
        """
        from mmrl.models.tiny_tokenizer import PLACEHOLDER_TOKENS

        tokenizer = getattr(processor, "tokenizer", processor)
        vocab = tokenizer.get_vocab()
        ids = {vocab[t] for t in PLACEHOLDER_TOKENS if t in vocab}
        for attr in self.placeholder_attrs:
            token = getattr(tokenizer, attr, None) or getattr(processor, attr, None)
            if isinstance(token, str) and token in vocab:
                ids.add(vocab[token])
        return sorted(ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(family={self.family!r})"
