"""The memory model's inputs read from a run config: the model's Facts (a shape, the tiny twin or
a local checkpoint, built on the meta device) and the per-process Workload (prompt, media and
completion tokens, group, micro-batch, layout) on a given number of processes.

    f, what = config_facts(cfg)
    w, media = config_workload(cfg, f, world=8)
    predict(f, w, Cluster(80, 8, "zero2"))
"""
from __future__ import annotations

import math

import torch

from mmrl.plan.memory import Facts, Workload, language_prefix, facts, model_facts

TEXT_TOKENS = 128  # chat template + question around the media, when not given


def config_facts(cfg, *, lora_r: int | None = None) -> tuple[Facts, str]:
    """(Facts, what the model is) for a RunConfig's model: a shape:NAME, a published checkpoint
    id with a shape here, the tiny twin (with model.tiny overrides), or a local checkpoint dir."""
    from mmrl.models import get_adapter, shapes, source
    from mmrl.train.policy import DTYPES

    m = cfg.model
    dtype = DTYPES[m.dtype]
    r = m.lora.r if lora_r is None else lora_r
    targets = tuple(m.lora.target_modules)
    name = shapes.CHECKPOINTS.get(m.path)  # a published checkpoint's Hub id
    origin = None if name else source.parse(m.path)
    if name or isinstance(origin, source.Shape):
        shape = name or origin.path[len(shapes.SCHEME):]
        return facts(shape, dtype=dtype, lora_r=r, lora_targets=targets), f"shape {shape}"
    if isinstance(origin, source.Tiny):
        from mmrl.models.tiny_tokenizer import tiny_tokenizer

        overrides = {k: v for k, v in m.tiny.items()
                     if k not in get_adapter(m.family).processor_override_keys and k != "init"}
        model_config = get_adapter(m.family).tiny_model_config(tiny_tokenizer(), **overrides)
        what = "the tiny twin"
    elif isinstance(origin, source.LocalDir):
        from transformers import AutoConfig

        model_config, what = AutoConfig.from_pretrained(m.path), m.path
    else:
        raise ValueError(f"model.path={m.path}: no shape is known for it; pass --shape (one of "
                         f"{', '.join(sorted(shapes.SHAPES))}) or a local checkpoint directory")
    import transformers

    with torch.device("meta"):
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = getattr(transformers, get_adapter(m.family).model_class)(model_config)
        finally:
            torch.set_default_dtype(default)
    return model_facts(model, dtype, lora_r=r, lora_targets=targets,
                       language=language_prefix(model)), what


def media_budget(cfg, f: Facts, temporal_patch: int = 2) -> tuple[int, int, str]:
    """(vision tokens, audio encoder frames, how they were read) per prompt from the data budgets:
    images data.image_max_pixels, videos data.video_max_pixels (T*H*W, two frames a token),
    audio data.audio_max_seconds (the encoder runs whole windows: 1500 positions per 30 s)."""
    from mmrl.models import get_adapter

    d, family = cfg.data, cfg.model.family
    factor = get_adapter(family).image_factor
    vision = audio = 0
    said = []
    if f.audio_window and d.audio_max_seconds:
        window_seconds = f.audio_window * 2 / 100  # 100 mel frames a second, stride 2
        audio = math.ceil(d.audio_max_seconds / window_seconds) * f.audio_window
        said.append(f"audio <= {d.audio_max_seconds:g} s (data.audio_max_seconds)")
    if family != "qwen2_audio":
        if d.video_max_pixels:
            vision = d.video_max_pixels // (factor * factor * temporal_patch)
            said.append(f"video <= {d.video_max_pixels} px (data.video_max_pixels)")
        elif d.image_max_pixels:
            vision = d.image_max_pixels // (factor * factor)
            said.append(f"image <= {d.image_max_pixels} px (data.image_max_pixels)")
    return vision, audio, ", ".join(said)


def _completion_bound(cfg) -> int:
    """Completion tokens a row may hold: rollout.max_new_tokens, or with tools or a user
    environment a whole trajectory's model and observation tokens (tools.max_tokens,
    env.max_tokens), if larger. Observation media
    are counted as text tokens: their vision-encoder activations are not in the plan."""
    r = cfg.rollout.max_new_tokens
    if not cfg.multi_turn:
        return r
    return max(r, cfg.tools.max_tokens if cfg.tools.enabled else cfg.env.max_tokens)


def config_workload(cfg, f: Facts, world: int, *, media_tokens: int | None = None,
                    audio_frames: int | None = None, prompt_tokens: int | None = None,
                    text_tokens: int = TEXT_TOKENS) -> tuple[Workload, str]:
    """The per-process Workload of a RunConfig on `world` processes; `media_tokens` (vision) and
    `audio_frames` (encoder positions) override what the data budgets say, `prompt_tokens` the
    prompt length (else text_tokens + media tokens)."""
    vision, frames, said = media_budget(cfg, f)
    if media_tokens is not None:
        vision, said = media_tokens, f"{media_tokens} vision tokens (given)"
    if audio_frames is not None:
        frames = audio_frames
        said += f"{', ' if said else ''}{audio_frames} audio encoder positions (given)"
    if not vision and not frames:
        raise ValueError("no media budget in the config (data.image_max_pixels, "
                         "data.video_max_pixels or data.audio_max_seconds): pass --media-tokens "
                         "N, the vision tokens of your largest prompt")
    audio_tokens = frames // 2  # the encoder pools 2:1 into prompt tokens
    r = cfg.rollout
    if r.prompts_per_step % world:
        raise ValueError(f"rollout.prompts_per_step={r.prompts_per_step} must divide by the "
                         f"{world} processes")
    w = Workload(prompt_tokens=prompt_tokens or text_tokens + vision + audio_tokens,
                 media_tokens=vision,
                 audio_frames=frames, completion=_completion_bound(cfg), group=r.num_generations,
                 prompts=r.prompts_per_step // world,  # sequence parallel too: train/sp.py
                 sequence_parallel=max(1, cfg.train.sequence_parallel),
                 micro_batch=max(1, cfg.train.micro_batch_size),
                 shared_prefix=cfg.train.shared_prefix,
                 dense_mask=cfg.model.dense_mask,
                 checkpointing=cfg.model.gradient_checkpointing,
                 reference=cfg.algo.uses_reference, lora_r=cfg.model.lora.r,
                 shared_prefill=r.shared_prefill and r.runs_hf_generate,
                 rounds_of=r.rounds_of or 0,
                 engine_share=r.vllm.gpu_memory_utilization if r.vllm_colocated else 0.0)
    return w, said or "no media"
