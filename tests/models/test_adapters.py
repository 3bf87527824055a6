"""mmrl.models on real tiny transformers models (no mocks): determinism, save/load, generation vs
training-forward log-probs, gradient into the vision tower, placeholder suppression."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrl.models import MODELS, get_adapter
from mmrl.models.forward import (collate, completion_logprobs, completion_mask_from_eos,
                                 generate)
from mmrl.models.tiny_tokenizer import tiny_tokenizer
from mmrl.types import Sample, SamplingParams

FAMILIES = ["qwen2_vl", "qwen2_5_vl"]
G = 3


def dataset_row_message(text: str, n_images: int = 1) -> list[dict]:
    """Messages as a `datasets` row holds them: every content key present, unused ones None."""
    image = {"type": "image", "text": None, "image": None, "video": None}
    return [{"role": "user", "content": [image] * n_images
             + [{"type": "text", "text": text, "image": None, "video": None}]}]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    adapter = get_adapter(request.param)
    model, processor = adapter.tiny(seed=0)
    return adapter, model, processor


@pytest.fixture(scope="module")
def prompts(tiny):
    """Two prompts of different lengths: one 56x56 image; two images of other sizes."""
    adapter, _, processor = tiny
    short = Sample(id="short", messages=dataset_row_message("How many squares?"))
    long = Sample(id="long", messages=dataset_row_message(
        "Which image has more red circles? Answer with <answer>N</answer>.", n_images=2))
    return [
        adapter.prompt_features(processor, short, [Image.new("RGB", (56, 56), "white")]),
        adapter.prompt_features(processor, long, [Image.new("RGB", (84, 112), "red"),
                                                  Image.new("RGB", (140, 56), "blue")]),
    ]


@pytest.fixture(scope="module")
def rollout(tiny, prompts):
    """G samples per prompt; a third of the vocabulary counts as EOS so that rows end at
    different lengths and the completion right-padding is exercised too."""
    adapter, model, processor = tiny
    eos = list(range(0, 780, 3))
    gen = generate(model, processor, prompts, SamplingParams(num_generations=G, max_new_tokens=12,
                   temperature=1.0, suppress_ids=adapter.placeholder_token_ids(processor),
                   seed=0, eos_ids=eos))
    return gen, eos


def test_registry_names_the_families():
    assert set(FAMILIES) <= set(MODELS.names())
    with pytest.raises(KeyError, match="unknown model family"):
        get_adapter("nope")


def test_tiny_is_deterministic_per_seed(tiny):
    adapter, model, _ = tiny
    again, _ = adapter.tiny(seed=0)
    other, _ = adapter.tiny(seed=1)
    a, b, c = model.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    cfg = model.config.text_config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.hidden_size // cfg.num_attention_heads) == (128, 4, 32)
    assert cfg.vocab_size == len(tiny_tokenizer())


def test_tiny_overrides_reach_model_and_processor(tiny):
    adapter = tiny[0]
    model, processor = adapter.tiny(hidden_size=64, num_attention_heads=2, vision_depth=1,
                                    min_pixels=28 * 28, max_pixels=28 * 28 * 4)
    assert model.config.text_config.hidden_size == 64
    assert model.config.vision_config.depth == 1
    big = adapter.prompt_features(processor, Sample(id="x", messages=dataset_row_message("hi")),
                                  [Image.new("RGB", (280, 280))])
    assert big.tensors["image_grid_thw"].prod().item() == 16  # capped at 4 merged tokens
    with pytest.raises(TypeError, match="unknown override"):
        adapter.tiny(not_a_key=1)


def test_tiny_fan_in_init_scales_each_layer_by_its_width(tiny):
    """init="fan_in": every Linear/Conv weight but lm_head drawn with std 1/sqrt(fan_in), per seed
    reproducibly; the default keeps transformers' 0.02; an unknown init is refused."""
    adapter, default, _ = tiny
    model, _ = adapter.tiny(seed=0, init="fan_in")
    again, _ = adapter.tiny(seed=0, init="fan_in")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))
    checked = 0
    for (name, module), (_, base) in zip(model.named_modules(), default.named_modules()):
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv3d)) and module.weight.numel() >= 4096:
            fan_in = module.weight[0].numel()
            want = 0.02 if name.endswith("lm_head") else fan_in ** -0.5
            assert module.weight.std().item() == pytest.approx(want, rel=0.1), name
            assert base.weight.std().item() == pytest.approx(0.02, rel=0.1), name
            checked += 1
    # the vision tower's patch embedding (fan_in 3*2*14*14) and merger, the LM's projections
    assert checked >= 10
    with pytest.raises(TypeError, match="init must be"):
        adapter.tiny(init="xavier")


def test_save_load_round_trip(tiny, prompts, tmp_path):
    adapter, model, processor = tiny
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, loaded_processor = adapter.load(str(tmp_path))
    sample = prompts[1].sample
    images = [Image.new("RGB", (84, 112), "red"), Image.new("RGB", (140, 56), "blue")]
    features = adapter.prompt_features(loaded_processor, sample, images)
    assert features.tensors.keys() == prompts[1].tensors.keys()
    assert all(torch.equal(features.tensors[k], prompts[1].tensors[k]) for k in features.tensors)
    assert adapter.placeholder_token_ids(loaded_processor) == adapter.placeholder_token_ids(processor)
    inputs = collate([features], pad_id=processor.tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_logprobs_equal_training_forward(tiny, prompts, rollout, temperature):
    adapter, model, processor = tiny
    gen, eos = rollout
    if temperature != 1.0:  # the same rollout, rescored at another temperature both ways
        gen = generate(model, processor, prompts, SamplingParams(num_generations=G, max_new_tokens=12,
                       temperature=temperature, seed=1, eos_ids=eos,
                       suppress_ids=adapter.placeholder_token_ids(processor)))
    assert gen.completion_ids.shape[0] == 2 * G
    lengths = gen.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows of different lengths: right padding exercised
    rows = [prompts[i // G] for i in range(2 * G)]  # group-major
    inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask,
                                   temperature=temperature)
    err = ((logp - gen.sampler_logp) * gen.completion_mask).abs().max().item()
    assert err <= 1e-5, err


def test_completion_mask_and_truncation():
    ids = torch.tensor([[5, 7, 2, 9], [5, 5, 5, 5], [2, 1, 1, 1]])
    mask, truncated = completion_mask_from_eos(ids, eos_ids=[2])
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_rollout_shapes_and_eos_contract(tiny, rollout):
    processor = tiny[2]
    gen, eos = rollout
    pad = processor.tokenizer.pad_token_id
    for ids, mask, trunc in zip(gen.completion_ids, gen.completion_mask, gen.truncated):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        assert (ids[n:] == pad).all()
        assert bool(trunc) == (ids[n - 1].item() not in eos)
    assert (gen.sampler_logp[gen.completion_mask == 0] == 0).all()


def test_missing_mm_token_type_ids_is_not_silently_right(tiny, prompts, rollout):
    """The trap: without mm_token_type_ids Qwen2-VL raises, Qwen2.5-VL falls back to 1-D
    positions and gives different log-probs."""
    _, model, processor = tiny
    gen, _ = rollout
    rows = [prompts[i // G] for i in range(2 * G)]
    inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
    inputs.pop("mm_token_type_ids")
    try:
        with torch.no_grad():
            logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask)
    except ValueError as e:
        assert "mm_token_type_ids" in str(e)
        return
    assert ((logp - gen.sampler_logp) * gen.completion_mask).abs().max() > 1e-4


def test_gradient_reaches_vision_tower(tiny, prompts, rollout):
    adapter, model, processor = tiny
    gen, _ = rollout
    rows = [prompts[i // G] for i in range(2 * G)]
    inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
    model.zero_grad()
    logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask)
    (logp * gen.completion_mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    visual = [n for n in grads if n.startswith("model.visual.") and grads[n].abs().sum() > 0]
    assert any("patch_embed" in n for n in visual) and any("blocks.0." in n for n in visual)
    model.zero_grad()


def test_placeholders_are_suppressed_and_rejected(tiny, prompts):
    adapter, model, processor = tiny
    placeholders = adapter.placeholder_token_ids(processor)
    ids = processor.tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|video_pad|>"])
    assert set(ids) <= set(placeholders)
    assert processor.tokenizer.pad_token_id not in placeholders
    kwargs = dict(num_generations=8, max_new_tokens=24)
    free = generate(model, processor, prompts, SamplingParams(seed=3, **kwargs))
    # A random model spreads ~1.5% of its mass on the 12 placeholders: ~380 draws hit some.
    assert torch.isin(free.completion_ids, torch.tensor(placeholders)).any()
    safe = generate(model, processor, prompts, SamplingParams(seed=3, suppress_ids=placeholders, **kwargs))
    assert not torch.isin(safe.completion_ids, torch.tensor(placeholders)).any()

    bad = safe.completion_ids[:2 * G].clone()
    bad[4, 5] = ids[0]
    rows = [prompts[i // G] for i in range(2 * G)]
    inputs = collate(rows, bad, None, processor.tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="row 4"):
        completion_logprobs(model, inputs, bad, None, placeholder_ids=placeholders)


def test_seeded_generation_is_reproducible_and_leaves_global_rng(tiny, prompts):
    _, model, processor = tiny
    state = torch.get_rng_state()
    a = generate(model, processor, prompts[:1], SamplingParams(num_generations=2, max_new_tokens=6, seed=7))
    b = generate(model, processor, prompts[:1], SamplingParams(num_generations=2, max_new_tokens=6, seed=7))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(torch.get_rng_state(), state)


def test_chat_template_renders_dataset_rows():
    tok = tiny_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}] + dataset_row_message("Count.") + [
        {"role": "assistant", "content": [{"type": "text", "text": "<answer>3</answer>", "image": None}]}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Count.<|im_end|>\n"
                    "<|im_start|>assistant\n<answer>3</answer><|im_end|>\n")
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("Count.<|im_end|>\n<|im_start|>assistant\n")
    # The tags stay ordinary text (rewards parse decoded text) but are only a few tokens long.
    ids = tok("<think>x</think><answer>3</answer>")["input_ids"]
    assert tok.decode(ids) == "<think>x</think><answer>3</answer>" and len(ids) <= 12
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.image_token == "<|image_pad|>" and tok.video_token == "<|video_pad|>"


def test_prompt_features_checks_media_count(tiny):
    adapter, _, processor = tiny
    sample = Sample(id="two-pics", messages=dataset_row_message("hi", n_images=2))
    with pytest.raises(ValueError, match="two-pics"):
        adapter.prompt_features(processor, sample, [Image.new("RGB", (56, 56))])
    with pytest.raises(ValueError, match="audios"):
        adapter.prompt_features(processor, sample, audios=[[0.0] * 160])
