"""The frozen-encoder cache: a step's forwards (old logprobs, reference, two update iterations
over micro-batches that cut a group) give the same logprobs and gradients with the cache as
without it, while each prompt's media is encoded once; an encoder that trains is never cached.
Real tiny Qwen2.5-VL (image + video), Qwen2-Audio and Qwen2.5-Omni (audio + video + image)."""
from __future__ import annotations

import copy
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.models import get_adapter
from mmrl.models.encoder_cache import EncoderCache, cacheable_kinds, media_order
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.media_embeds import local_encoder, splice_media
from mmrl.models.shared_prefix import shared_prefix_logprobs
from mmrl.types import Sample

G, WIDTH = 3, 6


def _frames(t, h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def _sine(seconds, hz):
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


MEDIA = {
    "qwen2_5_vl": ([["image", "video"], ["video"]],
                   [dict(images=[Image.new("RGB", (56, 84), "red")], videos=[_frames(4, 56, 56, 0)],
                         video_fps=2.0), dict(videos=[_frames(6, 84, 56, 1)], video_fps=1.0)],
                   ["vision"]),
    "qwen2_audio": ([["audio"], ["audio", "audio"]],
                    [dict(audios=[_sine(1.0, 440)]), dict(audios=[_sine(1.5, 880), _sine(0.5, 220)])],
                    ["audio", "projector"]),
    "qwen2_5_omni": ([["audio", "video"], ["image"]],
                     [dict(audios=[_sine(1.0, 440)], videos=[_frames(4, 56, 56, 2)], video_fps=2.0),
                      dict(images=[Image.new("RGB", (56, 56), "blue")])],
                     ["vision", "audio"]),
}


def _freeze(model, adapter, parts):
    prefixes = [adapter.module_prefixes[p] for p in parts]
    for name, p in model.named_parameters():
        if name.startswith(tuple(prefixes)):
            p.requires_grad_(False)


@pytest.fixture(scope="module", params=list(MEDIA))
def family_case(request):
    family = request.param
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    kinds, media, frozen = MEDIA[family]
    prompts = [adapter.prompt_features(processor, Sample(id=f"p{i}", messages=[{"role": "user", "content": [
        {"type": k} for k in ks] + [{"type": "text", "text": "What is it?"}]}]), **kw)
        for i, (ks, kw) in enumerate(zip(kinds, media))]
    rows = [p for p in prompts for _ in range(G)]
    pad = processor.tokenizer.pad_token_id
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 700, (len(rows), WIDTH), generator=gen)
    mask = (torch.arange(WIDTH)[None] < torch.tensor([6, 2, 4, 1, 5, 6])[:, None]).long()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad))
    return family, adapter, model, prompts, rows, ids, mask, pad, frozen


def _forward(model, rows, ids, mask, pad, index, shared):
    sub = [rows[i] for i in index]
    if shared:
        return shared_prefix_logprobs(model, sub, ids[index], mask[index], pad_id=pad)
    return completion_logprobs(model, collate(sub, ids[index], mask[index], pad), ids[index], mask[index])


def _step(model, ref, rows, ids, mask, pad, shared, cache=None):
    """What a step asks of the model with num_iterations=2 and beta > 0: old and reference
    logprobs, then two update iterations over micro-batches of 4 rows (a group is cut)."""
    batches = [[0, 1, 2, 3], [4, 5]]

    def serve(m, index):
        return cache.serve(m, [rows[i] for i in index], shared) if cache else nullcontext()

    outputs, grads = [], []
    with torch.no_grad():
        for m in (model, ref):
            for index in batches:
                with serve(m, index):
                    outputs.append(_forward(m, rows, ids, mask, pad, index, shared))
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        for index in batches:
            with serve(model, index):
                logp = _forward(model, rows, ids, mask, pad, index, shared)
            (logp * mask[index] * torch.linspace(0.5, 1.5, len(index))[:, None]).sum().backward()
            outputs.append(logp.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return outputs, grads


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "naive"])
def test_cached_step_equals_uncached_and_encodes_once(family_case, shared):
    family, adapter, model, prompts, rows, ids, mask, pad, frozen = family_case
    model = copy.deepcopy(model)
    _freeze(model, adapter, frozen)
    ref = copy.deepcopy(model).requires_grad_(False)
    cache = EncoderCache(model)
    assert cache.on and "not cached" not in cache.reason, cache.reason
    plain_out, plain_grads = _step(model, ref, rows, ids, mask, pad, shared)
    calls = []
    towers = [m for m in (getattr(o, "visual", None) for o in model.modules()) if m is not None]
    towers += [m for m in (getattr(o, "audio_tower", None) for o in model.modules()) if m is not None]
    hooks = [t.register_forward_hook(lambda *a: calls.append(1)) for t in towers]
    try:
        cached_out, cached_grads = _step(model, ref, rows, ids, mask, pad, shared, cache)
    finally:
        for h in hooks:
            h.remove()
    kinds_per_prompt = sum(1 for p in prompts for k in ("pixel_values", "pixel_values_videos",
                                                         "input_features") if k in p.tensors)
    assert cache.encoded == kinds_per_prompt and cache.served > 4 * kinds_per_prompt
    assert len(calls) == kinds_per_prompt  # uncached: 2 forwards x 2 models + 2 iterations, each
    for a, b in zip(plain_out, cached_out):
        assert float((a - b).abs().max()) <= 1e-6
    for a, b in zip(plain_grads, cached_grads):
        assert a.keys() == b.keys() and len(a) >= 20
        assert max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-20)) for k in a) <= 1e-6


def test_a_training_encoder_is_never_cached(family_case):
    family, adapter, model, *_ , frozen = family_case
    cache = EncoderCache(model)  # nothing frozen
    assert not cache.on and cache.kinds == []
    assert "not cached" in cache.reason and "encoder trains" in cache.reason
    assert isinstance(cache.serve(model, [], True), nullcontext)
    assert EncoderCache(model, enabled=False).reason == "not cached: off (train.cache_frozen_encoders=false)"


def test_lora_on_the_language_model_caches_the_towers():
    peft = pytest.importorskip("peft")
    adapter = get_adapter("qwen2_5_vl")
    model, _ = adapter.tiny(seed=0, num_hidden_layers=1)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    kinds, why = cacheable_kinds(wrapped)
    assert kinds == ["images", "videos"] and why == []


def test_a_partly_frozen_omni_caches_only_the_frozen_tower():
    adapter = get_adapter("qwen2_5_omni")
    model, _ = adapter.tiny(seed=0, num_hidden_layers=1)
    _freeze(model, adapter, ["audio"])
    cache = EncoderCache(model)
    assert cache.kinds == ["audios"]
    assert cache.reason.startswith("audio encoder output cached") and "vision encoder trains" in cache.reason


def test_a_frozen_qwen3_vl_tower_is_not_cached_and_says_why():
    # Its tower also feeds deepstack features, which encode() refuses: caching it crashed the
    # first step of every Qwen3-VL run with LoRA (caught by the memory-model check).
    adapter = get_adapter("qwen3_vl")
    model, _ = adapter.tiny(seed=0, num_hidden_layers=1)
    _freeze(model, adapter, ["vision"])
    cache = EncoderCache(model)
    assert not cache.on
    assert "deepstack features" in cache.reason and cache.summary.startswith(
        "encoders: run in every forward -- not cached: the vision encoder also feeds deepstack")


def test_runs_of_a_split_group_are_served_from_the_store(family_case):
    """shared_prefix.split_groups gives a group's later runs shallow copies of its prompt (the
    same tensors): the store is keyed by the tensors, so they encode nothing again."""
    import dataclasses

    family, adapter, model, prompts, rows, ids, mask, pad, frozen = family_case
    model = copy.deepcopy(model)
    _freeze(model, adapter, frozen)
    cache = EncoderCache(model)
    cache.fill(model, rows)
    encoded = cache.encoded
    runs = [r if i % G == 0 else dataclasses.replace(r) for i, r in enumerate(rows)]
    index = list(range(len(rows)))
    with torch.no_grad(), cache.serve(model, runs, True):
        got = _forward(model, runs, ids, mask, pad, index, True)
    with torch.no_grad():
        want = _forward(model, runs, ids, mask, pad, index, True)
    assert cache.encoded == encoded and float((got - want).abs().max()) <= 1e-6


def test_media_order_follows_the_layout():
    a, b = object(), object()
    assert media_order([a, a, b, b], shared_prefix=True) == [a, b]
    assert media_order([a, a, b], shared_prefix=False) == [a, a, b]


def test_splice_with_the_local_encoder_is_the_models_own_forward(family_case):
    """The seam itself: encoders taken out of the forward and spliced back give the same bits."""
    family, adapter, model, prompts, rows, ids, mask, pad, _ = family_case
    for shared in (True, False):
        plain = _forward(model, rows, ids, mask, pad, list(range(len(rows))), shared)
        with splice_media(model, local_encoder):
            spliced = _forward(model, rows, ids, mask, pad, list(range(len(rows))), shared)
        assert torch.equal(plain, spliced)


def test_fill_runs_every_encoder_equally_often_then_no_forward_encodes():
    """ZeRO-3 / FSDP2: `fill` calls each cached encoder once per prompt and kind (a dummy where
    the prompt has none), and the step's forwards then run no encoder at all."""
    from mmrl.models.towers import dummy_inputs

    family, (kinds, media, frozen) = "qwen2_5_omni", MEDIA["qwen2_5_omni"]
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=1)
    _freeze(model, adapter, frozen)
    prompts = [adapter.prompt_features(processor, Sample(id=f"f{i}", messages=[{"role": "user", "content": [
        {"type": k} for k in ks] + [{"type": "text", "text": "?"}]}]), **kw)
        for i, (ks, kw) in enumerate(zip(kinds, media))]
    rows = [p for p in prompts for _ in range(2)]
    pad = processor.tokenizer.pad_token_id
    ids = torch.randint(0, 700, (len(rows), 3), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    calls = []
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in (model.visual, model.audio_tower)]
    try:
        cache = EncoderCache(model)
        cache.fill(model, rows, dummy_inputs(Codec(adapter, processor), ["images", "videos", "audios"]))
        assert len(calls) == 2 * 3  # 2 prompts x 3 kinds, dummies included
        assert cache.encoded == 3  # the real media: audio + video, image
        with cache.serve(model, rows, True):
            shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad)
        assert len(calls) == 6 and cache.served == 3
    finally:
        for h in hooks:
            h.remove()
