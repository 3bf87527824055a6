"""The policy's weights in the form vLLM loads: parameter names mapped per family, LoRA merged,
FSDP2 shards gathered (`vllm_state_dict`), and a whole HF-format checkpoint (`export_for_vllm`).
Used by the colocated engine, the server client and the worker extension's protocol."""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from mmrl.models.codec import Codec

# Trainer parameter names (transformers 5.19 `named_parameters`) -> the checkpoint-format names
# vLLM's loader accepts, by `config.model_type`; prefixes, first match wins. Families not
# listed load under their transformers names (vLLM's Qwen2-VL / Qwen2.5-VL loaders map the
# transformers >= 4.52 layout themselves). Qwen2-Audio's vLLM loader only knows the original
# hub layout, and transformers 5.19's save_pretrained writes neither layout for it.
VLLM_NAME_MAPS: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen2_audio": (
        ("model.audio_tower.", "audio_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
    ),
    # vLLM serves the Omni thinker only inside a full Qwen2_5OmniConfig (see export_for_vllm),
    # with the hub layout's `thinker.` prefix on every weight.
    "qwen2_5_omni_thinker": (("", "thinker."),),
}


def vllm_name_map(model, adapter=None) -> tuple[tuple[str, str], ...]:
    """The prefix map for `model`: an adapter's `vllm_name_map` attribute wins over the table."""
    custom = getattr(adapter, "vllm_name_map", None)
    if custom is not None:
        return tuple(custom)
    return VLLM_NAME_MAPS.get(getattr(model.config, "model_type", ""), ())


def _merged_lora_state(model) -> dict[str, torch.Tensor] | None:
    """The state dict with every active LoRA adapter merged into its base weight under the base
    names (`q_proj.base_layer.weight` -> `q_proj.weight`, lora_* tensors dropped), computed
    without touching the model (merge/unmerge in place would drift the weights step after
    step). None when the model has no LoRA layers."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    layers = {n.removeprefix("base_model.model."): m for n, m in model.named_modules()
              if isinstance(m, LoraLayer)}
    if not layers:
        return None
    state = {}
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        state[name.removeprefix("base_model.model.").replace(".base_layer.", ".")] = tensor
    for name, layer in layers.items():
        if layer.merged or layer.disable_adapters:
            continue
        if any(getattr(layer, "use_dora", {}).get(a) for a in layer.active_adapters):
            raise NotImplementedError(f"{name}: DoRA adapters cannot be synced to vLLM (merge first)")
        delta = [layer.get_delta_weight(a) for a in layer.active_adapters
                 if a in layer.lora_A or a in getattr(layer, "lora_embedding_A", {})]
        if delta:
            key = f"{name}.weight"
            state[key] = (state[key] + sum(delta)).to(state[key].dtype)
    return state


def vllm_state_dict(model, adapter=None) -> dict[str, torch.Tensor]:
    """{checkpoint-format name: tensor} of every parameter and persistent buffer, detached,
    each storage once (tied embeddings: the first name wins; vLLM re-ties from the config).
    LoRA adapters (peft layers injected in `model`) are merged in (vLLM serves the merged
    policy; its own LoRA support is not used)."""
    rules = vllm_name_map(model, adapter)
    merged = _merged_lora_state(model)
    out, seen = {}, set()
    for name, tensor in (merged if merged is not None else model.state_dict()).items():
        if hasattr(tensor, "full_tensor"):  # an FSDP2 shard: gathered (every rank calls this)
            tensor = tensor.full_tensor()
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        for old, new in rules:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out[name] = tensor.detach()
    return out


def export_for_vllm(model, codec: Codec, path: str | Path) -> Path:
    """Write an HF-format checkpoint vLLM can load: config (with `architectures`), generation
    config, processor + tokenizer, and the weights under `vllm_state_dict` names."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    # The transformers class, not a wrapper FSDP2 derives from it (FSDPQwen2_5_VL...).
    config.architectures = [next(c.__name__ for c in type(model).__mro__
                                 if c.__module__.startswith("transformers."))]
    if config.model_type == "qwen2_5_omni_thinker":
        # vLLM registers only the full Omni architectures (thinker inside, talker not loaded).
        from transformers import Qwen2_5OmniConfig

        config = Qwen2_5OmniConfig(thinker_config=config.to_dict(), enable_audio_output=False)
        config.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    codec.processor.save_pretrained(path)
    tensors = {k: v.contiguous().cpu() for k, v in vllm_state_dict(model, codec.adapter).items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
