"""The model codec: a family's adapter bound to its processor, built once per run.

Everything that turns samples into the model's tensors and the model's tokens back into text
goes through one `Codec`: the tokenizer facts (pad id, placeholder ids, eos), the image facts
(image factor, box coordinates, pixel budget), feature building (`prompt_features`, `encode`),
decoding, and what each engine supports (`vllm_video`, `trainer_rope`), asked of the codec
instead of looked up in family-name tables. No function takes an adapter and a processor
together (tests/models/test_codec.py); it takes the codec.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from mmrl.models.base import ModelAdapter
from mmrl.types import PromptFeatures, Sample


class Codec:
    """`adapter` (a ModelAdapter instance) and the `processor` it loaded or built (tiny)."""

    def __init__(self, adapter: ModelAdapter, processor: Any):
        self.adapter, self.processor = adapter, processor

    @classmethod
    def tiny(cls, adapter: ModelAdapter, seed: int = 0, **overrides) -> tuple[Any, "Codec"]:
        """(model, codec) of the family's tiny twin (ModelAdapter.tiny)."""
        model, processor = adapter.tiny(seed, **overrides)
        return model, cls(adapter, processor)

    # ---- tokenizer facts -------------------------------------------------------------------
    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def tokenizer(self):
        return getattr(self.processor, "tokenizer", self.processor)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @cached_property
    def placeholder_ids(self) -> list[int]:
        """Every media pad / boundary token id (sampled, they break the next forward)."""
        return self.adapter.placeholder_token_ids(self.processor)

    # ---- image facts -----------------------------------------------------------------------
    @cached_property
    def token_chars(self) -> int:
        """The most characters one token stands for (byte-level: a vocabulary entry's length is
        its bytes): text longer than N x this cannot fit in N tokens, so the trajectory loop
        refuses an observation by its length before the tokenizer spends time and memory on it.
        A scan of the vocabulary, once per run."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    @property
    def image_factor(self) -> int:
        """Pixels per merged patch side: what image budgets round to."""
        return self.adapter.image_factor

    @property
    def box_coords(self) -> str:
        """How the family writes a box (rewards.boxes.COORDS)."""
        return self.adapter.box_coords

    @property
    def media_kinds(self) -> tuple[str, ...]:
        return self.adapter.media_kinds

    @property
    def patch_size(self) -> int:
        """Pixels per patch side of the image processor (an image grid cell), 14 without one."""
        ip = getattr(self.processor, "image_processor", None)
        return int(getattr(ip, "patch_size", 14) or 14)

    def pixel_budget(self) -> tuple[int, int] | None:
        """(min_pixels, max_pixels) the image processor resizes to as it holds them now
        (transformers 5 keeps them in `size` as shortest / longest edge); None when unset."""
        size = getattr(getattr(self.processor, "image_processor", None), "size", None)
        if size is not None and size.get("shortest_edge") and size.get("longest_edge"):
            return int(size["shortest_edge"]), int(size["longest_edge"])
        return None

    # ---- features and decoding ---------------------------------------------------------------
    def prompt_features(self, sample: Sample, images: list | None = None, **kwargs) -> PromptFeatures:
        """The one processor call for `sample` (ModelAdapter.prompt_features)."""
        return self.adapter.prompt_features(self.processor, sample, images, **kwargs)

    def encode(self, text: str, images: list | None = None, videos: list | None = None,
               audios: list | None = None, **kwargs) -> dict[str, torch.Tensor]:
        """Rendered chat text (and its media) -> tensors (ModelAdapter.encode)."""
        return self.adapter.encode(self.processor, text, images, videos, audios, **kwargs)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- what the engines ask ----------------------------------------------------------------
    @property
    def vllm_video(self) -> bool:
        """The colocated vLLM engine places this family's video where the trainer does."""
        return self.adapter.vllm_video

    @property
    def trainer_rope(self) -> tuple[str, str] | None:
        """(module, class) whose `get_rope_index` vLLM must use for the trainer's positions."""
        return self.adapter.trainer_rope

    def __repr__(self) -> str:
        return f"Codec({self.adapter!r}, {type(self.processor).__name__})"
