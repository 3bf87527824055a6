"""The model-family adapter: everything the trainer must know about one transformers family.

One instance per family, registered in `mmrl.models.MODELS`. The trainer never calls a processor
or names a placeholder token itself; it asks the adapter. transformers is imported lazily so that
`import mmrl.models` stays cheap (the CLI lists families without loading torch models).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from mmrl.types import AUDIO_SAMPLING_RATE, PromptFeatures, Sample

# Token-aligned keys of a processor output ([1, P]); every other tensor is a media tensor that
# concatenates along dim 0 (pixel_values [patches, D], image_grid_thw [n_images, 3], ...).
TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")

# mm_token_type_ids values that transformers' get_rope_index expects: text 0, image 1, video 2
# (3 = audio in families that have it). See Qwen2VLModel.get_rope_index.
TOKEN_TYPE = {"image": 1, "video": 2, "audio": 3}


def video_frames(video, fps: float | None = None) -> tuple[np.ndarray, float]:
    """(frames [T, H, W, 3] uint8, sampling fps) of one video.

    `video` is anything with `.frames` and `.fps` (mmrl.data.media.Video), or raw frames (an
    array [T, H, W, 3], a tensor, or a list of PIL images / arrays) whose fps comes from `fps`.
    The fps is the rate the frames were SAMPLED at, which sets the M-RoPE time axis; there is no
    default because transformers' silent one (24 fps) puts every frame at the wrong time.
    """
    frames = getattr(video, "frames", video)
    fps = getattr(video, "fps", None) or fps
    if torch.is_tensor(frames):
        frames = frames.cpu().numpy()
    elif isinstance(frames, (list, tuple)):
        frames = np.stack([np.asarray(f.convert("RGB") if hasattr(f, "convert") else f) for f in frames])
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be [T, H, W, 3], got shape {tuple(frames.shape)}")
    if not fps or fps <= 0:
        raise ValueError("video without a sampling fps: pass a Video (frames + fps) or video_fps=...")
    return frames, float(fps)


def video_metadata(frames: np.ndarray, fps: float) -> dict:
    """`video_metadata` for a transformers video processor called with do_sample_frames=False:
    its `sampled_fps` is then exactly `fps` (frames_indices cover every given frame)."""
    t, h, w = frames.shape[:3]
    return {"total_num_frames": int(t), "fps": float(fps), "frames_indices": list(range(t)),
            "duration": t / fps, "height": int(h), "width": int(w)}


def _transformers_attr(name: str):
    import transformers

    return getattr(transformers, name)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def tiny_text_config(tokenizer) -> dict:
    """Text-model defaults shared by every tiny family: sized for learning a small task on CPU;
    head_dim 32 because vLLM's CPU attention needs head_dim >= 32."""
    return dict(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )


def fan_in_init(model: torch.nn.Module) -> None:
    """Re-draw every Linear / Conv weight but the output head from normal(0, 1/sqrt(fan_in)).

    transformers' std 0.02 is sized for widths near 2500 (1/sqrt(2500)); in a 64-wide vision
    tower it leaves attention uniform and the MLPs near-linear, and the tiny tower learned to
    tell a circle from a square about half as fast (research/probes/vision_lr.py --init).
    Biases stay zero and embeddings and norms keep their init; uses the global torch RNG.
    """
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.split(".")[-1] == "lm_head":
                continue
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                module.weight.normal_(0.0, module.weight[0].numel() ** -0.5)


def set_override(family: str, target: dict, key: str, value, config_class=None,
                 aliases: dict | None = None) -> None:
    """target[key] = value after mapping `aliases`; TypeError unless the key is already in
    `target` or is a field of `config_class` (typos must fail, not vanish)."""
    key = (aliases or {}).get(key, key)
    if key not in target and config_class is not None:
        fields = getattr(config_class, "__dataclass_fields__", {})
        if key not in fields and not hasattr(config_class, key):
            raise TypeError(f"{family}.tiny(): unknown override {key!r}")
    elif key not in target:
        raise TypeError(f"{family}.tiny(): unknown override {key!r}")
    target[key] = value


class _MediaKwargsError(ValueError):
    """A media item the family's processor arguments cannot describe (e.g. a video without fps)."""


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
    # Parameter-name prefixes of the model's parts ("vision", "audio", "language"), as
    # `named_parameters()` spells them in the installed transformers; `model.freeze: [vision]`
    # freezes every parameter under the named prefixes.
    module_prefixes: dict[str, str] = {}
    # M-RoPE families (Qwen2-VL, Qwen2.5-VL) need `mm_token_type_ids` in every forward; families
    # whose model derives positions from input_ids alone reject it in generate().
    uses_token_type_ids: bool = True
    # Pixels per merged patch side (patch size x spatial merge): the factor image budgets round
    # to (qwen-vl-utils' `factor`). 14 px patches merged 2x2 in Qwen2/2.5-VL.
    image_factor: int = 28
    # How the family writes a box (rewards.boxes.COORDS): pixels of its resized input
    # (Qwen2.5-VL) or 0..1000 of the image (Qwen2-VL, Qwen3-VL); the crop tool reads boxes so.
    box_coords: str = "resized"
    # What the engines ask (through mmrl.models.codec.Codec), never a table of family names:
    # `vllm_video`: the colocated vLLM engine places this family's video where the trainer does
    # (M-RoPE positions, one placeholder per video: tests/integration/test_vllm.py), else
    # `vllm_video_refused` says why a video tool cannot run on vLLM (config_rules);
    # `trainer_rope`: (module, model class) whose `get_rope_index` the vLLM worker must use
    # because vLLM's M-RoPE rule after a video differs from transformers' (rollout/worker_ext.py).
    vllm_video: bool = False
    vllm_video_refused: str = "its video positions on vLLM are not verified"
    trainer_rope: tuple[str, str] | None = None

    # ---- loading ---------------------------------------------------------------------------

    def load(self, path: str, *, dtype: torch.dtype = torch.float32,
             attn_implementation: str = "sdpa", **processor_kwargs) -> tuple[Any, Any]:
        """(model, processor) from a hub-format checkpoint (local dir or hub id).

        A local dir, or HF_HUB_OFFLINE=1, never touches the network. `processor_kwargs` go to
        `AutoProcessor.from_pretrained` (e.g. min_pixels / max_pixels budgets).
        """
        local = os.path.isdir(path) or _offline()
        from mmrl.models import prefix_attention  # noqa: F401 (registers mmrl_prefix_varlen)

        model = _transformers_attr(self.model_class).from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=local)
        processor = _transformers_attr("AutoProcessor").from_pretrained(
            path, local_files_only=local, **processor_kwargs)
        return model, processor

    def tiny(self, seed: int = 0, **overrides) -> tuple[Any, Any]:
        """A small random (model, processor), fully offline; same seed -> same weights bit-for-bit.

        Overrides: text config keys (hidden_size, num_hidden_layers, ...), `vision_<key>` for the
        vision tower (vision_depth, vision_hidden_size, ...), and processor budgets
        (min_pixels, max_pixels), and `init`: "default" (transformers' normal(0, 0.02)) or
        "fan_in" (see `fan_in_init`). Unknown keys raise TypeError.
        """
        from transformers import GenerationConfig

        from mmrl.models.tiny_tokenizer import tiny_tokenizer

        tokenizer = tiny_tokenizer()
        processor_keys = {k: overrides.pop(k) for k in list(overrides) if k in self.processor_override_keys}
        init = overrides.pop("init", "default")
        if init not in ("default", "fan_in"):
            raise TypeError(f"{self.family}.tiny(): init must be 'default' or 'fan_in', not {init!r}")
        config = self.tiny_model_config(tokenizer, **overrides)
        processor = self.tiny_processor(tokenizer, config, **processor_keys)
        # fork_rng: building a tiny model must not move the caller's global RNG stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _transformers_attr(self.model_class)(config)
            if init == "fan_in":
                fan_in_init(model)
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
                        tools: list[dict] | None = None, **processor_kwargs) -> PromptFeatures:
        """The one processor call for `sample`, reused by rollout and every training forward.

        `images`: decoded PIL images in the order of the sample's image items; `videos`: Video
        objects (`.frames` [T, H, W, 3] + sampling `.fps`) or raw frame arrays with `video_fps=`;
        `audios`: 1-D float arrays at 16 kHz. Families reject media kinds they cannot take.
        `tools`: function specs for chat templates that render them (mmrl.tools.prompt).
        """
        media = {"images": images, "videos": videos, "audios": audios}
        for kind, items in media.items():
            if items and kind not in self.media_kinds:
                raise ValueError(f"{self.family}: cannot take {kind} (sample {sample.id!r}, {sample.source})")
        chat = {"tools": tools} if tools else {}
        text = processor.apply_chat_template(sample.messages, add_generation_prompt=True,
                                             tokenize=False, **chat)
        for kind, attr in (("images", "image_token"), ("videos", "video_token"), ("audios", "audio_token")):
            token = getattr(processor, attr, None)
            # Caught here, the mismatch names the sample; inside the processor it names nothing.
            if isinstance(token, str) and text.count(token) != len(media[kind] or ()):
                raise ValueError(f"sample {sample.id!r} ({sample.source}): {text.count(token)} {kind} "
                                 f"items in its messages but {len(media[kind] or ())} {kind} given")
        try:
            tensors = self.encode(processor, text, images, videos, audios, **processor_kwargs)
        except _MediaKwargsError as e:
            raise ValueError(f"sample {sample.id!r} ({sample.source}): {e}") from None
        return PromptFeatures(sample=sample, tensors=tensors)

    def encode(self, processor, text: str, images: list | None = None,
               videos: list | None = None, audios: list | None = None,
               **processor_kwargs) -> dict[str, torch.Tensor]:
        """The processor on rendered chat text (one placeholder per media item, expanded here):
        token-aligned tensors [1, n] and the media tensors. Prompts and the observation turns of
        tool-use trajectories (mmrl.models.trajectory) both come through here."""
        fps = processor_kwargs.pop("video_fps", None)
        try:
            kwargs, fixups = self.processor_media_kwargs(processor, images, videos, audios, fps)
        except ValueError as e:
            raise _MediaKwargsError(str(e)) from None
        out = processor(text=[text], return_tensors="pt", **kwargs, **processor_kwargs)
        tensors = {k: v if torch.is_tensor(v) else torch.as_tensor(v) for k, v in out.items()}
        tensors.update(fixups)
        if not self.uses_token_type_ids:
            tensors.pop("mm_token_type_ids", None)
        else:
            if "mm_token_type_ids" not in tensors:
                tensors["mm_token_type_ids"] = self.token_type_ids(processor, tensors["input_ids"])
            tensors["mm_token_type_ids"] = tensors["mm_token_type_ids"].long()
        return tensors

    def processor_media_kwargs(self, processor, images, videos, audios,
                               video_fps=None) -> tuple[dict, dict]:
        """(media keyword arguments of the processor call, tensors to set on its output).

        Videos: frames are already sampled (mmrl.data.media), so the processor must not sample
        again (`do_sample_frames=False`) and gets the sampling fps as metadata, from which
        Qwen2.5-VL computes `second_per_grid_ts`. Audio: transformers 5 calls it `audio=` (an
        `audios=` keyword is silently ignored) and the rate is passed so a mismatch raises.
        """
        kwargs: dict = {}
        if images:
            kwargs["images"] = list(images)
        if videos:
            pairs = [video_frames(v, video_fps) for v in videos]
            kwargs["videos"] = [frames for frames, _ in pairs]
            kwargs["video_metadata"] = [video_metadata(frames, fps) for frames, fps in pairs]
            kwargs["do_sample_frames"] = False
        if audios:
            kwargs["audio"] = [np.asarray(a, dtype=np.float32).reshape(-1) for a in audios]
            kwargs["sampling_rate"] = AUDIO_SAMPLING_RATE
        return kwargs, {}

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
