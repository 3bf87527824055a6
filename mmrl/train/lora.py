"""LoRA through peft: adapters on the language model (encoders excluded unless asked), the
reference policy as "adapter disabled" (no second model in memory), adapter-only checkpoints,
and a merged export.

peft injects its layers into the transformers model in place, so the trainer keeps calling the
plain model (generation configs, forward kwargs unchanged) and holds the PeftModel only for
saving, loading and `disable_adapter()`.
"""
from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from mmrl.config import LoraSpec

if TYPE_CHECKING:
    from mmrl.models.base import ModelAdapter

ADAPTER_FILE = "adapter_config.json"


def target_regex(spec: LoraSpec, language_prefix: str | None) -> str:
    names = "|".join(re.escape(m) for m in spec.target_modules)
    if spec.include_encoders or not language_prefix:
        return rf".*\.({names})$"
    return rf"^{re.escape(language_prefix)}.*\.({names})$"


def wrap(model, spec: LoraSpec, adapter: ModelAdapter):
    """-> PeftModel around `model` (which keeps working as the plain model, now with LoRA)."""
    from peft import LoraConfig, get_peft_model

    prefix = getattr(adapter, "module_prefixes", {}).get("language")
    cfg = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                     target_modules=target_regex(spec, prefix.rstrip(".") if prefix else None),
                     bias="none")
    peft_model = get_peft_model(model, cfg)
    if not any("lora_" in n for n, _ in model.named_parameters()):
        raise ValueError(f"model.lora.target_modules={spec.target_modules} matched no module of "
                         f"{type(model).__name__}")
    return peft_model


def is_adapter_checkpoint(path: Path) -> bool:
    return (Path(path) / ADAPTER_FILE).is_file()


def load(base_model, path: Path):
    """Base model + trainable adapter weights from an adapter-only checkpoint."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, str(path), is_trainable=True)


def reference_context(peft_model):
    """Context in which the model computes the reference policy (adapter off)."""
    return peft_model.disable_adapter() if peft_model is not None else nullcontext()


def export_merged(peft_model, processor, out: Path) -> Path:
    """Write a plain HF checkpoint with the adapters merged into the weights."""
    import copy

    merged = copy.deepcopy(peft_model).merge_and_unload()
    merged.save_pretrained(out)
    processor.save_pretrained(out)
    return out
