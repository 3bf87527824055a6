"""Run every encoder tower in every forward, for ZeRO-2/3 and FSDP2.

There, each module call is a collective: the ranks all-gather its parameters together (ZeRO-3,
FSDP2) and reduce its gradients in buckets as backward reaches it (ZeRO-2/3, FSDP2). A rank whose micro-batch has
no image skips the vision tower, the ranks' collectives fall out of step and training hangs, the
trap the single-modality trainers hit on mixed datasets. Here, a micro-batch missing a media kind
the model takes runs that tower on a tiny dummy input just before the language model, and adds
`0 * output` to the text embeddings: the same modules run in the same order on every rank, the
dummy gets a zero gradient, and the result is unchanged.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.types import Sample

# media kind -> (model kwarg that carries it, method of the multimodal model that encodes it)
KINDS = {"images": ("pixel_values", "get_image_features"),
         "videos": ("pixel_values_videos", "get_video_features"),
         "audios": ("input_features", "get_audio_features")}


def _encoder(owner, kind: str):
    """The callable that encodes `kind` on `owner`: its get_*_features method, or for families
    without one (Qwen2-Audio) the tower followed by its projector, as the model's forward runs
    them."""
    fn = getattr(owner, KINDS[kind][1], None)
    tower = getattr(owner, "audio_tower", None)
    if fn is None and kind == "audios" and isinstance(tower, torch.nn.Module):
        projector = getattr(owner, "multi_modal_projector", None)

        def fn(input_features):
            hidden = tower(input_features).last_hidden_state
            return projector(hidden) if projector is not None else hidden
    return fn


def model_parts(model):
    """(innermost module that encodes media, the text decoder it calls after its towers)."""
    def encodes(m):
        return any(_encoder(m, k) is not None for k in KINDS)

    while not encodes(model):  # through DeepSpeed / peft wrappers
        model = getattr(model, "module", None) or getattr(model, "model", None)
        if model is None:
            return None, None
    while isinstance(getattr(model, "model", None), torch.nn.Module) and encodes(model.model):
        model = model.model  # Qwen2_5_VLForConditionalGeneration -> Qwen2_5_VLModel
    for name in ("language_model", "model"):
        text = getattr(model, name, None)
        if isinstance(text, torch.nn.Module):
            return model, text
    return None, None


def dummy_inputs(codec: Codec, kinds) -> dict[str, dict[str, torch.Tensor]]:
    """Per media kind, the model kwargs of one tiny item (a 56x56 image, a 2-frame video, a
    second of silence), from the family's own processor call."""
    media = {"images": [Image.new("RGB", (56, 56))],
             "videos": [np.zeros((2, 56, 56, 3), dtype=np.uint8)],
             "audios": [np.zeros(16_000, dtype=np.float32)]}
    out = {}
    for kind in kinds:
        sample = Sample(id=f"dummy-{kind}", messages=[{"role": "user", "content": [
            {"type": kind[:-1]}, {"type": "text", "text": "."}]}], source="<dummy>")
        extra = {"video_fps": 2.0} if kind == "videos" else {}
        feats = codec.prompt_features(sample, **{kind: media[kind]}, **extra)
        out[kind] = {k: v for k, v in feats.tensors.items()
                     if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    return out


class TowerToucher:
    """`with toucher(): model(**inputs)` runs every tower the model has, present media or not."""

    def __init__(self, model, codec: Codec):
        owner, _ = model_parts(model)
        kinds = [k for k in codec.media_kinds
                 if owner is not None and _encoder(owner, k) is not None]
        missing = [k for k in codec.media_kinds if k not in kinds]
        if missing:
            raise ValueError(f"{codec.family}: ZeRO-2/3 and FSDP2 need every encoder to run on "
                             f"every rank, and this family's model has no "
                             f"{', '.join(KINDS[k][1] for k in missing)}; use ddp or ZeRO-1")
        self.dummies = dummy_inputs(codec, kinds)
        self.present: set[str] = set()
        # Kinds never touched: those whose frozen encoder's outputs are cached for the step
        # (models/encoder_cache.py; EncoderCache.fill ran them on every rank already).
        self.skip: set[str] = set()
        self.active = False
        self.owners: dict[torch.nn.Module, torch.nn.Module] = {}  # text decoder -> its model
        self.attach(model)

    def attach(self, model) -> None:
        """Hook `model` (the policy, or a sharded KL reference of the same family) so that its
        forwards inside `with toucher():` run every tower."""
        owner, text = model_parts(model)
        self.owners[text] = owner
        # First among the hooks: ZeRO-3/FSDP2 gather the decoder's weights in theirs, and a rank
        # with an image encodes it before that gather, so the dummy must run before it too.
        owner.register_forward_pre_hook(self._record, with_kwargs=True, prepend=True)
        text.register_forward_pre_hook(self._touch, with_kwargs=True, prepend=True)

    @contextmanager
    def __call__(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def _record(self, module, args, kwargs):
        if self.active:
            self.present = {k for k, (key, _) in KINDS.items() if kwargs.get(key) is not None}

    def _touch(self, module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if not self.active or embeds is None:
            return None
        extra = None
        for kind, inputs in self.dummies.items():
            if kind in self.present or kind in self.skip:
                continue
            fn = _encoder(self.owners[module], kind)
            accepted = inspect.signature(fn).parameters
            dev = embeds.device
            out = fn(**{k: v.to(dev) for k, v in inputs.items() if k in accepted})
            for t in _tensors(out):
                if t.is_floating_point():
                    term = t.float().sum() * 0.0
                    extra = term if extra is None else extra + term
        if extra is None:
            return None
        return args, {**kwargs, "inputs_embeds": embeds + extra.to(embeds.dtype)}


def _tensors(out):
    if torch.is_tensor(out):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _tensors(o)
    elif hasattr(out, "values"):  # ModelOutput
        for o in out.values():
            yield from _tensors(o)
