"""Rollout-engine pieces that need no vLLM install: the IS correction, prompt conversion, output
conversion, parameter-name mapping, and the HF engine's equality with forward.generate."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.config import RolloutConfig
from mmrl.models import MODELS, get_adapter
from mmrl.models.forward import generate
from mmrl.algos.correction import tis_metrics, tis_weights
from mmrl.rollout import RolloutEngine, make_engine
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.vllm_io import build_request, collapse_media_pads, media_pad_ids, to_generation
from mmrl.rollout.vllm_weights import vllm_state_dict
from mmrl.types import Sample, SamplingParams


def test_tis_weights_hand_computed():
    old = torch.tensor([[-1.0, -2.0, -0.1, 5.0], [-0.5, -0.5, 0.0, 0.0]])
    smp = torch.tensor([[-1.5, -1.0, -3.0, float("-inf")], [-0.5, -0.25, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    w = tis_weights(old, smp, mask, cap=2.0)
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 2.0, 0.0], [1.0, math.exp(-0.25), 0.0, 0.0]])
    assert torch.allclose(w, expected)
    assert torch.isfinite(w).all()  # the masked -inf never leaks
    m = tis_metrics(w, mask, cap=2.0)
    assert m["tis/clipped_frac"] == pytest.approx(1 / 5)
    assert m["tis/mean_weight"] == pytest.approx(float(expected.sum()) / 5)


def test_tis_weights_are_detached_and_checked():
    old = torch.zeros(2, 3, requires_grad=True)
    w = tis_weights(old, torch.zeros(2, 3), torch.ones(2, 3))
    assert not w.requires_grad and torch.equal(w, torch.ones(2, 3))
    with pytest.raises(ValueError, match="shapes differ"):
        tis_weights(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, old, torch.ones(2, 3), cap=0.0)


def test_collapse_media_pads():
    assert collapse_media_pads([1, 7, 7, 7, 2, 1, 7, 7, 2, 8, 8], [7, 8]) == [1, 7, 2, 1, 7, 2, 8]
    assert collapse_media_pads([5, 5, 5], [7]) == [5, 5, 5]  # only pads collapse


def test_build_request_from_trainer_prompt():
    """The trainer's expanded prompt -> one pad per image + the images themselves."""
    adapter = get_adapter("qwen2_vl")
    _, processor = adapter.tiny(seed=0)
    images = [Image.new("RGB", (56, 56), "white"), Image.new("RGB", (84, 112), "red")]
    sample = Sample(id="s", messages=[{"role": "user", "content": [{"type": "image"}] * 2
                                       + [{"type": "text", "text": "Hi"}]}])
    p = adapter.prompt_features(processor, sample, images)
    p.media = {"images": images}
    pads = media_pad_ids(processor)
    req = build_request(p, pads)
    ids = p.input_ids.tolist()
    assert req["prompt_token_ids"].count(pads["image"]) == 2 < ids.count(pads["image"])
    assert [i for i in req["prompt_token_ids"] if i != pads["image"]] == [i for i in ids if i != pads["image"]]
    assert req["multi_modal_data"]["image"] == images
    p.media = {"images": images[:1]}
    with pytest.raises(ValueError, match="sample 's'.*2 image placeholder.*1 image item"):
        build_request(p, pads)


def test_qwen3_vl_video_frame_blocks_fold_to_one_pad():
    """Qwen3-VL writes a video as timestamped frame blocks inside one outer block: vLLM gets the
    outer block around one video pad (it writes the timestamps again); an image stays as is."""
    from mmrl.data.media import Video
    from mmrl.rollout.vllm_io import frame_marks

    adapter = get_adapter("qwen3_vl")
    _, processor = adapter.tiny(seed=0, num_hidden_layers=1)
    video = Video(np.zeros((4, 56, 56, 3), np.uint8), 2.0, [0.0, 0.5, 1.0, 1.5], 2.0)
    image = Image.new("RGB", (56, 56), "white")
    p = adapter.prompt_features(processor, Sample(id="v", messages=[{"role": "user", "content": [
        {"type": "video"}, {"type": "image"}, {"type": "text", "text": "Hi"}]}]), [image],
        videos=[video])
    p.media = {"videos": [video], "images": [image]}
    tok = processor.tokenizer
    assert "<0.2 seconds>" in tok.decode(p.input_ids)  # the processor's per-frame timestamps
    req = build_request(p, media_pad_ids(processor), frame_marks(processor))
    assert tok.decode(req["prompt_token_ids"]).startswith(
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
        "<|vision_start|><|image_pad|><|vision_end|>Hi")
    assert frame_marks(get_adapter("qwen2_5_vl").tiny(seed=0)[1]) is None


def test_server_request_is_the_colocated_one_with_media_as_data_urls():
    """Server mode sends the colocated engine's token ids (one pad per item) and each image and
    audio clip, in order, as a lossless data URL; a video is refused with a sentence."""
    import base64
    import io

    import soundfile

    from mmrl.rollout.vllm_server import generate_request

    adapter = get_adapter("qwen2_5_omni")
    _, processor = adapter.tiny(seed=0)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)),
              Image.new("RGB", (84, 56), "red")]
    audio = rng.uniform(-0.5, 0.5, 8000).astype(np.float32)
    sample = Sample(id="s", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "audio"}, {"type": "image"}, {"type": "text", "text": "Hi"}]}])
    p = adapter.prompt_features(processor, sample, images, audios=[audio])
    p.media = {"images": images, "audios": [audio]}
    body = generate_request(p, media_pad_ids(processor))
    assert body["token_ids"] == build_request(p, media_pad_ids(processor))["prompt_token_ids"]
    kinds = [part["type"] for part in body["content_parts"]]
    assert kinds == ["image_url", "image_url", "audio_url"]  # vLLM queues them per modality

    def decoded(part):
        header, data = part["url"].split(",", 1)
        return header, io.BytesIO(base64.b64decode(data))

    for part, image in zip(body["content_parts"], images):
        header, raw = decoded(part)
        assert header == "data:image/png;base64"
        assert np.array_equal(np.asarray(Image.open(raw)), np.asarray(image))
    header, raw = decoded(body["content_parts"][2])
    wave, rate = soundfile.read(raw, dtype="float32")
    assert header == "data:audio/wav;base64" and rate == 16000 and np.array_equal(wave, audio)
    text = adapter.prompt_features(processor, Sample(id="t", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]))
    text.media = {}
    assert generate_request(text, media_pad_ids(processor)) == {
        "token_ids": text.input_ids.tolist(), "content_parts": None}
    from mmrl.data.media import Video

    clip = Video(np.zeros((4, 56, 56, 3), np.uint8), 2.0, [0.0, 0.5, 1.0, 1.5], 2.0)
    video = adapter.prompt_features(processor, Sample(id="v", messages=[
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Hi"}]}]),
        videos=[clip])
    video.media = {"videos": [clip]}
    with pytest.raises(NotImplementedError, match="sample 'v'.*colocated"):
        generate_request(video, media_pad_ids(processor))


def test_to_generation_layout_and_placeholder_error():
    gen = to_generation([([5, 6, 2], [-0.1, -0.2, -0.3], False), ([7], [-1.0], True)], pad_id=0)
    assert gen.completion_ids.tolist() == [[5, 6, 2], [7, 0, 0]]
    assert gen.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert torch.allclose(gen.sampler_logp, torch.tensor([[-0.1, -0.2, -0.3], [-1.0, 0.0, 0.0]]))
    assert gen.truncated.tolist() == [False, True]
    with pytest.raises(ValueError, match="completion row 1 holds media placeholder token id 9"):
        to_generation([([5], [-0.1], False), ([4, 9], [-1.0, -2.0], False)], pad_id=0, placeholder_ids=[9])


@pytest.mark.skipif("qwen2_audio" not in MODELS.names(), reason="no qwen2_audio adapter")
def test_vllm_names_qwen2_audio():
    """transformers 5.19 names -> the original hub layout vLLM's Qwen2-Audio loader takes."""
    model, _ = get_adapter("qwen2_audio").tiny(seed=0, num_hidden_layers=1)
    names = set(vllm_state_dict(model))
    assert {"language_model.lm_head.weight", "language_model.model.embed_tokens.weight",
            "audio_tower.conv1.weight", "multi_modal_projector.linear.weight"} <= names
    assert not any(n.startswith("model.") for n in names)


def test_vllm_names_dedupe_tied_embeddings():
    model, _ = get_adapter("qwen2_vl").tiny(seed=0, num_hidden_layers=1, tie_word_embeddings=True)
    model.tie_weights()
    names = set(vllm_state_dict(model))
    assert "model.language_model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_hf_engine_is_forward_generate():
    adapter = get_adapter("qwen2_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=1)
    sample = Sample(id="s", messages=[{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "Hi"}]}])
    prompts = [adapter.prompt_features(processor, sample, [Image.new("RGB", (56, 56), "white")])]
    engine = make_engine(RolloutConfig(backend="hf"), model, Codec(adapter, processor))
    assert isinstance(engine, HFEngine) and isinstance(engine, RolloutEngine)
    kw = SamplingParams(num_generations=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0,
                        do_sample=True, suppress_ids=adapter.placeholder_token_ids(processor), seed=3)
    a, b = engine.generate(prompts, kw), generate(model, processor, prompts, kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    engine.sync_weights(model)  # no-op


def test_vllm_names_merge_lora_without_touching_the_model():
    peft = pytest.importorskip("peft")
    import copy

    model, _ = get_adapter("qwen2_vl").tiny(seed=0, num_hidden_layers=1)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)$"))
    with torch.no_grad():  # lora_B starts at 0: make the adapters do something
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = vllm_state_dict(model)
    expected = copy.deepcopy(wrapped).merge_and_unload().state_dict()
    assert set(got) == set(expected)
    assert all(torch.allclose(got[k], expected[k], atol=1e-6) for k in expected)
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(got[q], before[q.replace(".weight", ".base_layer.weight")])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
