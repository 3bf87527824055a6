"""generate_shared: each prompt prefilled once (media encoder included), G samples decoded from
copies of its cache, optionally in rounds of g: the same samples as the unshared G-prefill path
and as any other round size for the same seed, a bounded KV cache, and HF's greedy output."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs, generate
from mmrl.models.shared_generate import generate_shared
from mmrl.types import Sample, SamplingParams

EOS = list(range(0, 780, 7))  # a seventh of the vocabulary ends a row: uneven lengths


def message(text: str, kind: str = "image", n: int = 1) -> list[dict]:
    return [{"role": "user", "content": [{"type": kind}] * n + [{"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def vl():
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    prompts = [
        adapter.prompt_features(processor, Sample(id="a", messages=message("How many?")),
                                [Image.new("RGB", (56, 84), "white")]),
        adapter.prompt_features(processor, Sample(id="b", messages=message("Which is red?", n=2)),
                                [Image.new("RGB", (84, 112), "red"), Image.new("RGB", (140, 56), "blue")]),
    ]
    return adapter, model, processor, prompts


def kwargs(adapter, processor, **extra):
    return SamplingParams(**{**dict(num_generations=4, max_new_tokens=12, seed=3, eos_ids=EOS,
                                    suppress_ids=adapter.placeholder_token_ids(processor)), **extra})


def assert_same_samples(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.truncated, b.truncated)
    assert (a.sampler_logp - b.sampler_logp).abs().max() <= 1e-5


def test_prefill_once_equals_per_row_prefill(vl):
    adapter, model, processor, prompts = vl
    shared_stats, row_stats = {}, {}
    shared = generate_shared(model, processor, prompts, kwargs(adapter, processor), stats=shared_stats)
    unshared = generate_shared(model, processor, prompts, kwargs(adapter, processor),
                               prefill="per_row", stats=row_stats)
    assert_same_samples(shared, unshared)
    assert (shared_stats["prefill_rows"], row_stats["prefill_rows"]) == (2, 8)
    lengths = shared.completion_mask.sum(1)
    assert lengths.min() < lengths.max() and shared.completion_ids.shape[0] == 8


def test_rounds_give_the_same_samples(vl):
    adapter, model, processor, prompts = vl
    full = generate_shared(model, processor, prompts, kwargs(adapter, processor))
    for g in (1, 3):
        assert_same_samples(full, generate_shared(model, processor, prompts,
                                                  kwargs(adapter, processor), rounds_of=g))


def test_sampler_logp_equals_training_forward(vl):
    adapter, model, processor, prompts = vl
    for temperature in (1.0, 0.7):
        gen = generate_shared(model, processor, prompts, kwargs(
            adapter, processor, temperature=temperature, top_k=50, top_p=0.9))
        rows = [prompts[i // 4] for i in range(8)]
        inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
        with torch.no_grad():
            logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask,
                                       temperature=temperature)
        assert ((logp - gen.sampler_logp) * gen.completion_mask).abs().max() <= 1e-5
        assert not torch.isin(gen.completion_ids, torch.tensor(adapter.placeholder_token_ids(processor))).any()


def test_greedy_equals_hf_generate(vl):
    adapter, model, processor, prompts = vl
    common = dict(max_new_tokens=10, do_sample=False, eos_ids=EOS,
                  suppress_ids=adapter.placeholder_token_ids(processor))
    ours = generate_shared(model, processor, prompts, SamplingParams(num_generations=2, **common))
    hf = generate(model, processor, prompts, SamplingParams(num_generations=1, **common))  # HF: 1 when greedy
    for i in (0, 1):
        assert torch.equal(ours.completion_ids[2 * i], hf.completion_ids[i])
        assert torch.equal(ours.completion_ids[2 * i + 1], hf.completion_ids[i])
        assert (ours.sampler_logp[2 * i] - hf.sampler_logp[i]).abs().max() <= 1e-5


def test_seed_reproducible_and_global_rng_untouched(vl):
    adapter, model, processor, prompts = vl
    state = torch.get_rng_state()
    a = generate_shared(model, processor, prompts[:1], kwargs(adapter, processor))
    b = generate_shared(model, processor, prompts[:1], kwargs(adapter, processor))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(torch.get_rng_state(), state)
    other = generate_shared(model, processor, prompts[:1], kwargs(adapter, processor, seed=4))
    assert not torch.equal(a.completion_ids, other.completion_ids)


def test_rounds_bound_the_cache_at_g16(vl):
    """G = 16 in rounds of 4 holds at most 60% of the full group's KV cache (here ~30%)."""
    adapter, model, processor, prompts = vl
    args = kwargs(adapter, processor, num_generations=16, eos_ids=[], max_new_tokens=8)
    full, rounds, per_row = {}, {}, {}
    a = generate_shared(model, processor, prompts, args, stats=full)
    b = generate_shared(model, processor, prompts, args, rounds_of=4, stats=rounds)
    generate_shared(model, processor, prompts, args, prefill="per_row", stats=per_row)
    assert_same_samples(a, b)
    assert rounds["peak_cache_bytes"] <= 0.6 * full["peak_cache_bytes"]
    assert rounds["peak_cache_bytes"] <= 0.6 * per_row["peak_cache_bytes"]


def test_audio_prefill_once_equals_per_row():
    qwen2_audio = pytest.importorskip("mmrl.models.qwen2_audio")
    adapter = qwen2_audio.Qwen2AudioAdapter()
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    rng = np.random.RandomState(0)
    prompts = [adapter.prompt_features(processor, Sample(id=f"a{i}", messages=message("Said?" * (i + 1), "audio")),
                                       audios=[rng.randn(16000 * (i + 1)).astype(np.float32) * 0.1])
               for i in range(2)]
    args = kwargs(adapter, processor)
    shared = generate_shared(model, processor, prompts, args, rounds_of=3)
    assert_same_samples(shared, generate_shared(model, processor, prompts, args, prefill="per_row"))
