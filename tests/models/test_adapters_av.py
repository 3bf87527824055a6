"""mmrl.models for video, audio and omni on real tiny transformers models (no mocks).

Per family x modality: generation-time log-probs equal the training forward's, gradient reaches
the encoder, dropping the media tensors changes the log-probs (the TRL trap), placeholders are
suppressed, save/load round-trips; plus the video time axis (fps) and the omni checkpoint layout.
Media are made in-process: sine waves at 16 kHz, random uint8 frames.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models import MODELS, get_adapter
from mmrl.models.forward import collate, completion_logprobs, generate
from mmrl.types import PromptFeatures, Sample, SamplingParams

G = 3
EOS = list(range(0, 780, 3))  # a third of the vocabulary ends a row: rows of different lengths
CASES = [("qwen2_audio", "audio"), ("qwen2_5_omni", "audio"), ("qwen2_5_omni", "image"),
         ("qwen2_5_omni", "video"), ("qwen2_vl", "video"), ("qwen2_5_vl", "video"),
         ("qwen3_vl", "image"), ("qwen3_vl", "video")]
ENCODER = {"audio": "audio", "image": "vision", "video": "vision"}


@dataclass
class FakeVideo:
    """Same fields as mmrl.data.media.Video (the adapters only read frames/fps/timestamps)."""

    frames: np.ndarray
    fps: float
    timestamps: list[float] = field(default_factory=list)
    duration: float = 0.0
    path: str = ""


def sine(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def frames(t: int, h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def messages(kinds: list[str], text: str) -> list[dict]:
    """As a `datasets` row holds them: every content key present, unused ones None."""
    blank = {"text": None, "image": None, "video": None, "audio": None}
    return [{"role": "user", "content": [dict(blank, type=k) for k in kinds]
             + [dict(blank, type="text", text=text)]}]


def media(modality: str) -> list[tuple[list[str], str, dict]]:
    """Two prompts of different lengths and media sizes: (content kinds, text, media kwargs)."""
    if modality == "audio":
        return [(["audio"], "What sound?", {"audios": [sine(1.0, 440)]}),
                (["audio", "audio"], "Which is higher? Answer with <answer>N</answer>.",
                 {"audios": [sine(2.5, 880), sine(0.5, 220)]})]
    if modality == "image":
        return [(["image"], "How many squares?", {"images": [Image.new("RGB", (56, 56), "white")]}),
                (["image", "image"], "Which image is red? Answer with <answer>N</answer>.",
                 {"images": [Image.new("RGB", (84, 112), "red"), Image.new("RGB", (140, 56), "blue")]})]
    return [(["video"], "What happens?", {"videos": [FakeVideo(frames(4, 56, 56, 0), fps=2.0)]}),
            (["video", "video"], "Which is longer? Answer with <answer>N</answer>.",
             {"videos": [FakeVideo(frames(6, 56, 84, 1), fps=1.0), frames(8, 84, 56, 2)],
              "video_fps": 4.0})]


@functools.lru_cache(maxsize=None)
def tiny(family: str):
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0)
    return adapter, model, processor


def build_prompts(family: str, modality: str) -> list[PromptFeatures]:
    adapter, _, processor = tiny(family)
    return [adapter.prompt_features(processor, Sample(id=f"{modality}{i}", messages=messages(kinds, text)),
                                    **kw) for i, (kinds, text, kw) in enumerate(media(modality))]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request):
    """(adapter, model, processor, prompts, rollout, modality), one rollout per case."""
    family, modality = request.param
    adapter, model, processor = tiny(family)
    prompts = build_prompts(family, modality)
    gen = generate(model, processor, prompts, SamplingParams(num_generations=G, max_new_tokens=10, temperature=1.0,
                   suppress_ids=adapter.placeholder_token_ids(processor), seed=0, eos_ids=EOS))
    return adapter, model, processor, prompts, gen, modality


def training_inputs(processor, prompts, gen) -> dict:
    rows = [prompts[i // G] for i in range(len(prompts) * G)]  # group-major
    return collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)


def test_registry_names_av_families():
    assert {"qwen2_audio", "qwen2_5_omni", "qwen3_vl", "qwen2_vl", "qwen2_5_vl"} <= set(MODELS.names())


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen2_5_omni", "qwen3_vl"])
def test_tiny_is_deterministic_per_seed(family):
    adapter, model, _ = tiny(family)
    again, _ = adapter.tiny(seed=0)
    other, _ = adapter.tiny(seed=1)
    a, b, c = model.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    text = model.config.get_text_config()
    assert text.hidden_size // text.num_attention_heads >= 32  # vLLM CPU attention
    with pytest.raises(TypeError, match="unknown override"):
        adapter.tiny(not_a_key=1)


def test_generation_logprobs_equal_training_forward(case):
    _, model, processor, prompts, gen, _ = case
    lengths = gen.completion_mask.sum(1)
    assert gen.completion_ids.shape[0] == 2 * G and lengths.min() < lengths.max()
    with torch.no_grad():
        logp = completion_logprobs(model, training_inputs(processor, prompts, gen),
                                   gen.completion_ids, gen.completion_mask)
    err = ((logp - gen.sampler_logp) * gen.completion_mask).abs().max().item()
    assert err <= 1e-5, err


def test_dropping_media_changes_logprobs(case):
    """What TRL 1.16 does for video/audio: the placeholders stay, the features go. The forward
    still runs (no error to notice) but scores a different model input."""
    adapter, model, processor, prompts, gen, _ = case
    inputs = training_inputs(processor, prompts, gen)
    dropped = {k: v for k, v in inputs.items() if k not in adapter.media_keys}
    assert set(inputs) - set(dropped)
    with torch.no_grad():
        logp = completion_logprobs(model, dropped, gen.completion_ids, gen.completion_mask)
    assert ((logp - gen.sampler_logp) * gen.completion_mask).abs().max() > 1e-2


def test_gradient_reaches_encoder(case):
    adapter, model, processor, prompts, gen, modality = case
    prefix = adapter.module_prefixes[ENCODER[modality]]
    model.zero_grad()
    logp = completion_logprobs(model, training_inputs(processor, prompts, gen),
                               gen.completion_ids, gen.completion_mask)
    (logp * gen.completion_mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert all(torch.isfinite(g).all() for g in grads.values())
    hit = [n for n, g in grads.items() if n.startswith(prefix) and g.abs().sum() > 0]
    first = ("conv1." if modality == "audio" else "patch_embed.")
    block0 = ("layers.0." if modality == "audio" else "blocks.0.")
    assert any(first in n for n in hit) and any(block0 in n for n in hit), hit[:5]


class _Bias(torch.nn.Module):
    """lm_head + a constant bias: makes placeholders the likeliest tokens by far."""

    def __init__(self, head, bias):
        super().__init__()
        self.head, self.bias = head, bias

    def forward(self, x):
        return self.head(x) + self.bias


def test_placeholders_are_suppressed(case):
    adapter, model, processor, prompts, _, modality = case
    placeholders = adapter.placeholder_token_ids(processor)
    tokens = {"audio": ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"],
              "image": [getattr(processor, "image_token", None)],
              "video": [getattr(processor, "video_token", None)]}[modality]
    assert set(processor.tokenizer.convert_tokens_to_ids(tokens)) <= set(placeholders)
    assert processor.tokenizer.pad_token_id not in placeholders
    bias = torch.zeros(model.lm_head.out_features)
    bias[placeholders] = 30.0
    head = model.lm_head
    model.lm_head = _Bias(head, bias)
    try:
        kwargs = dict(num_generations=2, max_new_tokens=4, seed=0, eos_ids=EOS)
        free = generate(model, processor, prompts[:1], SamplingParams(**dict(kwargs, max_new_tokens=1)))
        safe = generate(model, processor, prompts, SamplingParams(suppress_ids=placeholders, **kwargs))
    finally:
        model.lm_head = head
    assert torch.isin(free.completion_ids, torch.tensor(placeholders)).all()
    assert not torch.isin(safe.completion_ids, torch.tensor(placeholders)).any()
    bad = safe.completion_ids.clone()
    bad[1, 0] = placeholders[0]
    rows = [prompts[i // 2] for i in range(4)]
    with pytest.raises(ValueError, match="row 1"):
        completion_logprobs(model, collate(rows, bad, None, processor.tokenizer.pad_token_id), bad,
                            None, placeholder_ids=placeholders)


@pytest.mark.parametrize("family,modality", [("qwen2_audio", "audio"), ("qwen2_5_omni", "video"),
                                             ("qwen3_vl", "video")])
def test_save_load_round_trip(family, modality, tmp_path):
    adapter, model, processor = tiny(family)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, loaded_processor = adapter.load(str(tmp_path))
    before, after = build_prompts(family, modality)[1], None
    kinds, text, kw = media(modality)[1]
    after = adapter.prompt_features(loaded_processor, Sample(id="x", messages=messages(kinds, text)), **kw)
    assert after.tensors.keys() == before.tensors.keys()
    assert all(torch.equal(after.tensors[k], before.tensors[k]) for k in after.tensors)
    assert adapter.placeholder_token_ids(loaded_processor) == adapter.placeholder_token_ids(processor)
    inputs = collate([after], pad_id=processor.tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)


def test_omni_thinker_loads_from_full_omni_checkpoint(tmp_path):
    """Hub Qwen2.5-Omni checkpoints are full models: config.json nests `thinker_config`, weights
    live under `thinker.` next to talker/token2wav ones. The thinker class must pick its part."""
    from safetensors.torch import load_file, save_file

    adapter, model, processor = tiny("qwen2_5_omni")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    full = {f"thinker.{k}": v for k, v in weights.items()}
    full["talker.model.embed_tokens.weight"] = torch.zeros(4, 8)
    save_file(full, tmp_path / "model.safetensors", metadata={"format": "pt"})
    thinker_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniForConditionalGeneration"],
        "thinker_config": thinker_config, "enable_audio_output": False}))
    loaded, _ = adapter.load(str(tmp_path))
    assert type(loaded).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loaded.config.vision_start_token_id == model.config.vision_start_token_id


def _video_sample():
    return Sample(id="v", messages=messages(["video"], "When?"))


@pytest.mark.parametrize("fps,seconds", [(2.0, 1.0), (4.0, 0.5), (1.0, 2.0)])
def test_fps_sets_seconds_per_temporal_patch(fps, seconds):
    """temporal_patch_size 2: a grid step spans 2 / fps seconds. Without metadata, transformers
    5.19 would assume 24 fps (1/12 s)."""
    adapter, model, processor = tiny("qwen2_5_vl")
    video = frames(4, 56, 56, 3)
    feats = adapter.prompt_features(processor, _video_sample(), videos=[FakeVideo(video, fps=fps)])
    assert feats.tensors["second_per_grid_ts"].tolist() == [seconds]
    raw = adapter.prompt_features(processor, _video_sample(), videos=[video], video_fps=fps)
    assert raw.tensors["second_per_grid_ts"].tolist() == [seconds]
    # ... and the M-RoPE time axis moves by tokens_per_second * seconds per temporal patch.
    t = feats.tensors
    pos, _ = model.model.get_rope_index(t["input_ids"], t["mm_token_type_ids"],
                                        video_grid_thw=t["video_grid_thw"],
                                        second_per_grid_ts=t["second_per_grid_ts"],
                                        attention_mask=t["attention_mask"])
    video_t = pos[0, 0][t["input_ids"][0] == processor.video_token_id].unique()
    step = model.config.vision_config.tokens_per_second * seconds
    assert (video_t[1:] - video_t[:-1]).tolist() == [step]

    omni, omni_model, omni_processor = tiny("qwen2_5_omni")
    o = omni.prompt_features(omni_processor, _video_sample(), videos=[FakeVideo(video, fps=fps)]).tensors
    assert o["video_second_per_grid"].tolist() == [seconds]
    pos, _ = omni_model.get_rope_index(o["input_ids"], video_grid_thw=o["video_grid_thw"],
                                       attention_mask=o["attention_mask"],
                                       second_per_grids=o["video_second_per_grid"])
    video_t = pos[0, 0][o["input_ids"][0] == omni_model.config.video_token_id].unique()
    assert (video_t[1:] - video_t[:-1]).tolist() == [int(omni_model.config.position_id_per_seconds * seconds)]


def test_video_needs_fps_and_qwen3_reads_timestamps():
    adapter, _, processor = tiny("qwen2_5_vl")
    with pytest.raises(ValueError, match="fps"):
        adapter.prompt_features(processor, _video_sample(), videos=[frames(4, 56, 56, 0)])
    q3, _, q3_processor = tiny("qwen3_vl")

    def text(video):
        ids = q3.prompt_features(q3_processor, _video_sample(), videos=[video]).tensors["input_ids"][0]
        return q3_processor.tokenizer.decode(ids)

    video = frames(4, 64, 64, 0)  # 2 temporal patches; a patch's time is its frames' mean
    assert "<0.5 seconds>" in text(FakeVideo(video, fps=1.0)) and "<2.5 seconds>" in text(FakeVideo(video, fps=1.0))
    clip = FakeVideo(video, fps=1.0, timestamps=[10.0, 11.0, 12.0, 13.0])  # from the file start
    assert "<10.5 seconds>" in text(clip) and "<12.5 seconds>" in text(clip)


def test_audio_features_and_tokens():
    """1 s of 16 kHz audio = 100 mel frames = 25 <|AUDIO|> tokens; the window is chunk_length
    seconds (5 in tiny()), longer audio is cut to it."""
    adapter, model, processor = tiny("qwen2_audio")
    assert processor.feature_extractor.chunk_length * 50 == model.config.audio_config.max_source_positions
    sample = Sample(id="a", messages=messages(["audio"], "hi"))
    one = adapter.prompt_features(processor, sample, audios=[sine(1.0, 440)]).tensors
    assert one["input_features"].shape == (1, 128, 500) and one["feature_attention_mask"].sum() == 100
    assert (one["input_ids"] == processor.audio_token_id).sum() == 25
    assert "mm_token_type_ids" not in one  # 1-D RoPE: generate() rejects the key
    long = adapter.prompt_features(processor, sample, audios=[sine(7.0, 440)]).tensors
    assert long["feature_attention_mask"].sum() == 500
    model30, processor30 = adapter.tiny(chunk_length=30)
    assert processor30.feature_extractor.chunk_length == 30
    assert model30.config.audio_config.max_source_positions == 1500


@pytest.mark.parametrize("family", sorted(MODELS.names()))
def test_module_prefixes_name_real_parameters(family):
    """`model.freeze: [vision]` resolves through module_prefixes: each part must match
    parameters, and the encoder and language parts must not overlap."""
    adapter, model, _ = tiny(family)
    names = [n for n, _ in model.named_parameters()]
    parts = adapter.module_prefixes
    assert "language" in parts and ("vision" in parts or "audio" in parts)
    for part, prefix in parts.items():
        assert any(n.startswith(prefix) for n in names), (part, prefix)
    for enc in ("vision", "audio"):
        if enc in parts:
            assert not any(n.startswith(parts[enc]) and n.startswith(parts["language"]) for n in names)
    covered = [n for n in names if any(n.startswith(p) for p in parts.values())]
    assert set(names) - set(covered) <= {"lm_head.weight"}


def test_collate_refuses_mixed_token_type_layouts():
    audio = build_prompts("qwen2_audio", "audio")[0]
    image = build_prompts("qwen3_vl", "image")[0]
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        collate([audio, image], pad_id=0)
