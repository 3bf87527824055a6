"""Model families: `get_adapter(family)` -> ModelAdapter (load / tiny / prompt_features / ...).

The generic forward pieces (collate, completion_logprobs, generate) live in `mmrl.models.forward`.
"""
from __future__ import annotations

from mmrl.models.base import ModelAdapter
from mmrl.models.qwen2_5_omni import Qwen2_5OmniAdapter
from mmrl.models.qwen2_5_vl import Qwen2_5_VLAdapter
from mmrl.models.qwen2_audio import Qwen2AudioAdapter
from mmrl.models.qwen2_vl import Qwen2VLAdapter
from mmrl.models.qwen3_vl import Qwen3VLAdapter
from mmrl.registry import Registry

MODELS: Registry[ModelAdapter] = Registry("model family")
MODELS.add("qwen2_vl", Qwen2VLAdapter())
MODELS.add("qwen2_5_vl", Qwen2_5_VLAdapter())
MODELS.add("qwen2_audio", Qwen2AudioAdapter())
MODELS.add("qwen2_5_omni", Qwen2_5OmniAdapter())
MODELS.add("qwen3_vl", Qwen3VLAdapter())


def get_adapter(family: str) -> ModelAdapter:
    """The adapter registered as `family` ("pkg.mod:attr" imports a user adapter instance)."""
    adapter = MODELS.get(family)
    return adapter() if isinstance(adapter, type) else adapter


__all__ = ["MODELS", "ModelAdapter", "get_adapter"]
