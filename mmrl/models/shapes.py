"""Real-shape models: the published Qwen checkpoints' architectures with random weights.

A random model of the real shape costs exactly what the real one costs per token (the same
matmuls, attention, vocabulary and vision/audio towers), so speed and memory measured on it hold
for the real checkpoint. Nothing is downloaded: the numbers below are copied from each
checkpoint's published config.json, and `params` is the size the Hugging Face model card shows
(safetensors), which tests/models/test_shapes.py checks the built model against (1%).

    model.path: shape:qwen2_5_vl-7b        # in a config (model.family must match)
    model.path: shape:qwen2_5_vl-7b:8      # the same widths with 8 of its 28 text layers
    build("qwen2_5_vl-3b", layers=None, dtype=torch.bfloat16, device="cuda")

What differs from the real checkpoint, on purpose:
- the tokenizer is the tiny offline one (~800 tokens, mmrl.models.tiny_tokenizer) while the
  embedding and LM head keep the real vocabulary SIZE; sampled ids beyond the tiny vocabulary
  decode to nothing, so rewards read garbage (irrelevant for speed and memory);
- media token ids are the tiny tokenizer's, not 151655 etc.;
- `layers=k` keeps k text layers and scales every tower's depth by the same fraction (its full-
  attention / DeepStack block indexes moved proportionally), so cost per layer is unchanged and
  a report can scale a measurement back to full depth (it must say so).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

SCHEME = "shape:"


@dataclass(frozen=True)
class Shape:
    family: str
    checkpoint: str  # the hub id whose config.json these numbers are
    params: float | None  # parameters the model card shows (safetensors), e.g. 3.75e9
    # adapter.tiny_model_config overrides: text keys, `vision_<key>`, `audio_<key>`, rope keys
    dims: dict = field(default_factory=dict)
    # the checkpoint's preprocessor pixel budget per image (min, max), in pixels
    pixels: tuple[int, int] = (56 * 56, 28 * 28 * 16384)
    chunk_length: int = 30  # audio seconds per window (Whisper front end)

    @property
    def text_layers(self) -> int:
        return self.dims["num_hidden_layers"]


# Text settings every published Qwen2/2.5 checkpoint below shares.
_QWEN2 = dict(rms_norm_eps=1e-6, rope_theta=1_000_000.0, hidden_act="silu")
# Qwen2.5-VL's vision tower (3B and 7B): 32 windowed blocks, full attention every 8th.
_VL25_VISION = dict(vision_depth=32, vision_hidden_size=1280, vision_intermediate_size=3420,
                    vision_num_heads=16, vision_hidden_act="silu", vision_window_size=112,
                    vision_fullatt_block_indexes=[7, 15, 23, 31], vision_tokens_per_second=2,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
# Whisper-large-v3-sized audio encoder of Qwen2-Audio and Qwen2.5-Omni.
_WHISPER_L = dict(audio_d_model=1280, audio_encoder_layers=32, audio_encoder_attention_heads=20,
                  audio_encoder_ffn_dim=5120)

SHAPES: dict[str, Shape] = {
    "qwen2_5_vl-3b": Shape("qwen2_5_vl", "Qwen/Qwen2.5-VL-3B-Instruct", 3.75e9, dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=128000, mrope_section=[16, 24, 24], **_QWEN2, **_VL25_VISION),
        pixels=(3136, 12845056)),
    "qwen2_5_vl-7b": Shape("qwen2_5_vl", "Qwen/Qwen2.5-VL-7B-Instruct", 8.29e9, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=128000, mrope_section=[16, 24, 24], **_QWEN2, **_VL25_VISION),
        pixels=(3136, 12845056)),
    "qwen2_vl-7b": Shape("qwen2_vl", "Qwen/Qwen2-VL-7B-Instruct", 8.29e9, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, mrope_section=[16, 24, 24], **_QWEN2,
        vision_depth=32, vision_embed_dim=1280, vision_mlp_ratio=4, vision_num_heads=16,
        vision_hidden_act="quick_gelu", patch_size=14, spatial_merge_size=2,
        temporal_patch_size=2), pixels=(3136, 12845056)),
    "qwen3_vl-4b": Shape("qwen3_vl", "Qwen/Qwen3-VL-4B-Instruct", 4.44e9, dict(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_theta=5_000_000.0,
        mrope_section=[24, 20, 20], vision_depth=24, vision_hidden_size=1024,
        vision_intermediate_size=4096, vision_num_heads=16, vision_hidden_act="gelu_pytorch_tanh",
        vision_num_position_embeddings=2304, vision_deepstack_visual_indexes=[5, 11, 17],
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2),
        pixels=(65536, 16777216)),
    "qwen3_vl-8b": Shape("qwen3_vl", "Qwen/Qwen3-VL-8B-Instruct", 8.77e9, dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_theta=5_000_000.0,
        mrope_section=[24, 20, 20], vision_depth=27, vision_hidden_size=1152,
        vision_intermediate_size=4304, vision_num_heads=16, vision_hidden_act="gelu_pytorch_tanh",
        vision_num_position_embeddings=2304, vision_deepstack_visual_indexes=[8, 16, 24],
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2),
        pixels=(65536, 16777216)),
    # Qwen-7B's LM (multi-head attention, 156032 tokens) behind the audio encoder.
    "qwen2_audio-7b": Shape("qwen2_audio", "Qwen/Qwen2-Audio-7B-Instruct", 8.40e9, dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=156032, tie_word_embeddings=False,
        max_position_embeddings=8192, rms_norm_eps=1e-5, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **_WHISPER_L)),
    # The thinker only (what mmrl trains): no published size of its own (the card's 10.7B counts
    # the talker and token2wav too). The test checks its parts against published models instead:
    # Qwen2.5-7B's LM (7.61B), + Qwen2.5-VL-7B's tower (8.29B), + Qwen2-Audio's encoder.
    "qwen2_5_omni-7b": Shape("qwen2_5_omni", "Qwen/Qwen2.5-Omni-7B", None, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, mrope_section=[16, 24, 24], **_QWEN2,
        **{k: v for k, v in _VL25_VISION.items() if k != "vision_tokens_per_second"},
        **_WHISPER_L), pixels=(3136, 12845056)),
}
# Hub ids -> shape names, so a recipe's model.path names its shape (base and Instruct alike).
CHECKPOINTS = {s.checkpoint: name for name, s in SHAPES.items()}
CHECKPOINTS.update({s.checkpoint.removesuffix("-Instruct"): name for name, s in SHAPES.items()})

# Tower depth keys and the block-index lists that must move with them.
_DEPTH_KEYS = ("vision_depth", "audio_encoder_layers")
_INDEX_KEYS = ("vision_fullatt_block_indexes", "vision_deepstack_visual_indexes")


def parse(path: str) -> tuple[str, int | None]:
    """"shape:NAME" or "shape:NAME:LAYERS" -> (NAME, LAYERS or None); ValueError says what is
    allowed."""
    spec = path[len(SCHEME):] if path.startswith(SCHEME) else path
    name, _, layers = spec.partition(":")
    if name not in SHAPES:
        raise ValueError(f"model.path={path}: unknown shape {name!r}; known: "
                         f"{', '.join(sorted(SHAPES))} (optionally :LAYERS, e.g. "
                         f"shape:qwen2_5_vl-7b:8)")
    if layers and not (layers.isdigit() and 1 <= int(layers) <= SHAPES[name].text_layers):
        raise ValueError(f"model.path={path}: LAYERS must be 1..{SHAPES[name].text_layers}")
    return name, int(layers) if layers else None


def dims(name: str, layers: int | None = None) -> dict:
    """The shape's config overrides, with `layers` text layers and every tower's depth scaled by
    the same fraction (block indexes moved proportionally, kept inside the new depth)."""
    shape = SHAPES[name]
    out = {k: (list(v) if isinstance(v, list) else v) for k, v in shape.dims.items()}
    if layers is None or layers == shape.text_layers:
        return out
    fraction = layers / shape.text_layers
    out["num_hidden_layers"] = layers
    for key in _DEPTH_KEYS:
        if key in out:
            full = out[key]
            out[key] = max(1, round(full * fraction))
            for index_key in _INDEX_KEYS:
                if key == "vision_depth" and index_key in out:
                    moved = sorted({min(out[key] - 1, round((i + 1) * out[key] / full) - 1)
                                    for i in out[index_key]})
                    out[index_key] = [max(0, i) for i in moved]
    return out


def config(name: str, layers: int | None = None, tokenizer=None):
    """The family's transformers config at the shape (media token ids from `tokenizer`, the tiny
    one by default)."""
    from mmrl.models import get_adapter
    from mmrl.models.tiny_tokenizer import tiny_tokenizer

    shape = SHAPES[name]
    overrides = dims(name, layers)
    if shape.family in ("qwen2_audio",):
        overrides["chunk_length"] = shape.chunk_length
    return get_adapter(shape.family).tiny_model_config(tokenizer or tiny_tokenizer(), **overrides)


def processor(name: str, model_config, tokenizer=None):
    """The family's real processor classes with the checkpoint's patch/merge geometry and pixel
    budget, around the tiny tokenizer (Qwen-VL processors need torchvision, as for real
    checkpoints)."""
    from mmrl.models import get_adapter
    from mmrl.models.tiny_tokenizer import tiny_tokenizer

    shape = SHAPES[name]
    adapter = get_adapter(shape.family)
    tokenizer = tokenizer or tiny_tokenizer()
    if shape.family == "qwen2_audio":
        return adapter.tiny_processor(tokenizer, model_config)
    low, high = shape.pixels
    kwargs = {"chunk_length": shape.chunk_length} if shape.family == "qwen2_5_omni" else {}
    return adapter.tiny_processor(tokenizer, model_config, min_pixels=low, max_pixels=high,
                                  **kwargs)


def build(name: str, layers: int | None = None, *, dtype: torch.dtype = torch.bfloat16,
          device: str | torch.device | None = None, seed: int = 0):
    """(model, processor) of shape `name` with random weights (transformers' own init, seeded
    without moving the caller's RNG). `device="meta"` builds it with no memory at all (parameter
    counts, memory planning); on CUDA it is built in place, not on the host then moved."""
    from transformers import GenerationConfig

    from mmrl.models import get_adapter
    from mmrl.models.tiny_tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    cfg = config(name, layers, tokenizer)
    adapter = get_adapter(SHAPES[name].family)
    device = torch.device(device or "cpu")
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in the training dtype: no fp32 copy of 8B params
        try:
            with device:
                import transformers
                model = getattr(transformers, adapter.model_class)(cfg)
        finally:
            torch.set_default_dtype(default)
    model.eval()
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    model.generation_config = GenerationConfig(eos_token_id=eos, bos_token_id=None,
                                               pad_token_id=tokenizer.pad_token_id)
    return model, processor(name, cfg, tokenizer)


def build_for(path: str, family: str, *, dtype: torch.dtype, seed: int = 0):
    """`model.path: shape:NAME[:LAYERS]` -> (model, processor), on this process's GPU when there
    is one (an 8B model is never materialised on the host first)."""
    import os

    name, layers = parse(path)
    if SHAPES[name].family != family:
        raise ValueError(f"model.path={path} is a {SHAPES[name].family} shape but model.family="
                         f"{family}; set model.family={SHAPES[name].family}")
    device = (f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available()
              else "cpu")
    return build(name, layers, dtype=dtype, device=device, seed=seed)


__all__ = ["CHECKPOINTS", "SCHEME", "SHAPES", "Shape", "build", "build_for", "config", "dims",
           "parse", "processor"]
