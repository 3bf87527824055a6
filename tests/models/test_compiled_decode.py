"""Compiled decode (mmrl/models/compiled_decode.py): the token steps on a static KV cache through
one torch.compile'd function give eager decoding's greedy tokens exactly, sampled logprobs equal
to the training forward's (1e-5, float32, as tests/models/test_shared_prefix_generate.py), for
each M-RoPE family (Qwen2.5-Omni's thinker included), G samples from one prefill and per-row prefills; compiles are counted and
bounded; a family that cannot compile says so.

The tests compile with dynamo's "eager" backend: the whole step is still captured as one graph
(fullgraph: a graph break fails), but inductor's code generation (~30-40 s a shape on this CPU)
is skipped; `mmrl bench --which decode` runs inductor and checks its greedy tokens."""
from __future__ import annotations

import logging

import pytest
import torch
from PIL import Image

from mmrl.models import compiled_decode, get_adapter
from mmrl.models.compiled_decode import CompiledDecoder, compile_blocker
from mmrl.models.forward import collate, completion_logprobs, generate
from mmrl.models.shared_generate import generate_shared
from mmrl.rollout.hf import HFEngine, decode_path
from mmrl.types import Sample, SamplingParams

EOS = list(range(0, 780, 7))  # a seventh of the vocabulary ends a row: uneven lengths


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    monkeypatch.setattr(compiled_decode, "BACKEND", "eager")
    torch._dynamo.reset()


def family(name: str):
    adapter = get_adapter(name)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    model.eval()
    prompts = [adapter.prompt_features(processor, Sample(id=f"p{i}", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": text}]}]), [Image.new("RGB", size, colour)])
        for i, (text, size, colour) in enumerate([("How many?", (56, 84), "white"),
                                                 ("Which one is red, left or right?", (112, 140), "red")])]
    return adapter, model, processor, prompts


@pytest.fixture(scope="module")
def vl():
    return family("qwen2_5_vl")


def params(adapter, processor, **extra):
    return SamplingParams(**{**dict(num_generations=3, max_new_tokens=10, seed=3, eos_ids=EOS,
                                    suppress_ids=adapter.placeholder_token_ids(processor)), **extra})


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni"])
def test_greedy_compiled_equals_eager_for_each_mrope_family(name):
    adapter, model, processor, prompts = family(name)
    sampling = params(adapter, processor, do_sample=False)
    decoder = CompiledDecoder(model, bucket=32)
    eager = generate_shared(model, processor, prompts, sampling)
    compiled = generate_shared(model, processor, prompts, sampling, decoder=decoder)
    assert torch.equal(eager.completion_ids, compiled.completion_ids)
    assert torch.equal(eager.completion_mask, compiled.completion_mask)
    assert (eager.sampler_logp - compiled.sampler_logp).abs().max() <= 1e-5
    # HF's own generate (one row per prompt when greedy) gives the same tokens.
    hf = generate(model, processor, prompts, params(adapter, processor, do_sample=False,
                                                    num_generations=1))
    assert torch.equal(compiled.completion_ids[::3], hf.completion_ids)
    assert decoder.stats()["decode/compiles"] == 1


def test_sampled_logprobs_equal_the_training_forward(vl):
    adapter, model, processor, prompts = vl
    decoder = CompiledDecoder(model, bucket=32)
    for temperature in (1.0, 0.7):
        sampling = params(adapter, processor, temperature=temperature, top_k=50, top_p=0.9)
        gen = generate_shared(model, processor, prompts, sampling, decoder=decoder)
        eager = generate_shared(model, processor, prompts, sampling)
        assert torch.equal(gen.completion_ids, eager.completion_ids)  # same uniforms, same draws
        rows = [prompts[i // 3] for i in range(6)]
        inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
        with torch.no_grad():
            logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask,
                                       temperature=temperature)
        assert ((logp - gen.sampler_logp) * gen.completion_mask).abs().max() <= 1e-5


def test_per_row_prefill_and_rounds_decode_the_same_samples(vl):
    adapter, model, processor, prompts = vl
    decoder = CompiledDecoder(model, bucket=32)
    sampling = params(adapter, processor)
    shared = generate_shared(model, processor, prompts, sampling, decoder=decoder)
    for kw in (dict(prefill="per_row"), dict(rounds_of=1)):
        other = generate_shared(model, processor, prompts, sampling, decoder=decoder, **kw)
        assert torch.equal(shared.completion_ids, other.completion_ids)
        assert (shared.sampler_logp - other.sampler_logp).abs().max() <= 1e-5


def test_compiles_are_bucketed_counted_and_bounded(vl, caplog):
    adapter, model, processor, prompts = vl
    decoder = CompiledDecoder(model, bucket=64, max_compiles=2)
    for new_tokens in (4, 6):  # both fit the same 64-token bucket: one compile
        generate_shared(model, processor, prompts, params(adapter, processor, max_new_tokens=new_tokens),
                        decoder=decoder)
    assert decoder.stats()["decode/compiles"] == 1 and decoder.stats()["decode/compile_s"] > 0
    width = collate(prompts, pad_id=0)["input_ids"].shape[1]
    beyond = decoder.cache_length(width + 6) + 1 - width  # the next bucket: a second compile
    generate_shared(model, processor, prompts, params(adapter, processor, max_new_tokens=beyond,
                                                      eos_ids=[0]), decoder=decoder)
    assert decoder.stats()["decode/compiles"] == 2
    with caplog.at_level(logging.WARNING, logger="mmrl.models.compiled_decode"):
        # A third shape (one prompt: other rows) is past max_compiles: uncompiled, and said so.
        eager = generate_shared(model, processor, prompts[:1], params(adapter, processor))
        got = generate_shared(model, processor, prompts[:1], params(adapter, processor),
                              decoder=decoder)
    assert torch.equal(eager.completion_ids, got.completion_ids)
    stats = decoder.stats()
    assert stats["decode/compiles"] == 2 and stats["decode/uncompiled_steps"] > 0
    assert stats["decode/recompiles"] == 0
    assert "max_compiles" in caplog.text


def test_timing_stats_count_the_decode_forwards(vl):
    adapter, model, processor, prompts = vl
    stats = {}
    gen = generate_shared(model, processor, prompts, params(adapter, processor, eos_ids=[0]),
                          stats=stats)
    assert gen.completion_ids.shape[1] == 10 and stats["decode_forwards"] == 9
    width = collate(prompts, pad_id=0)["input_ids"].shape[1]
    # 2 layers x 2 kv heads x 32 wide x (k, v) x 4 bytes a token; 6 rows; forward i reads width+i.
    per_token = 2 * 2 * 32 * 2 * 4
    assert stats["kv_read_bytes"] == per_token * 6 * sum(width + i for i in range(1, 10))
    assert stats["prefill_s"] > 0 and stats["decode_s"] > 0


def test_the_engine_says_which_decode_runs_and_why(vl):
    audio = pytest.importorskip("mmrl.models.qwen2_audio")
    cls = audio.Qwen2AudioAdapter.model_class
    import transformers

    audio_class = getattr(transformers, cls)
    assert "_can_compile_fullgraph = False" in compile_blocker(audio_class)
    compiled, line = decode_path(audio_class, "auto", cuda=True)
    assert not compiled and "Qwen2AudioForConditionalGeneration" in line and "eager" in line
    with pytest.raises(ValueError, match="compile_decode=compiled"):
        decode_path(audio_class, "compiled", cuda=False)
    _, model, processor, _ = vl
    assert decode_path(model, "auto", cuda=False)[0] is False  # CPU: eager unless asked
    assert decode_path(model, "auto", cuda=True)[0] is True
    engine = HFEngine(model, processor, compile_decode="compiled")
    assert engine.decoder is not None and "compiled" in engine.decode_path
    assert HFEngine(model, processor).decoder is None


def test_the_config_summary_and_validate_name_the_decode_path():
    from mmrl import config
    from mmrl.cli import config_summary
    from mmrl.validate import validate

    base = ["data.train=x.jsonl", "rewards=[{name: accuracy}]"]
    cfg = config.load(None, [*base, "model.family=qwen2_audio", "rollout.compile_decode=compiled"])
    assert [p for p in validate(cfg) if p.startswith("rollout.compile_decode")
            and "Qwen2AudioForConditionalGeneration sets _can_compile_fullgraph = False" in p]
    audio = config.load(None, [*base, "model.family=qwen2_audio"])
    assert "decode: eager (rollout.compile_decode=auto: Qwen2Audio" in config_summary(audio)
    cfg = config.load(None, [*base, "model.family=qwen2_5_vl"])
    expected = ("decode: compiled static-cache step" if torch.cuda.is_available()
                else "decode: eager (rollout.compile_decode=auto on CPU")
    assert expected in config_summary(cfg)
    with pytest.raises(Exception, match="compile_decode"):
        config.load(None, [*base, "rollout.compile_decode=on"])  # the values are named


def test_the_engine_decodes_compiled_from_one_prefill_a_prompt(vl):
    adapter, model, processor, prompts = vl
    sampling = params(adapter, processor, do_sample=False, num_generations=1)
    compiled = HFEngine(model, processor, compile_decode="compiled")
    got = compiled.generate(prompts * 2, sampling)  # the engine's default: HF generate
    want = HFEngine(model, processor).generate(prompts * 2, sampling)
    assert torch.equal(got.completion_ids, want.completion_ids)
    timing = compiled.take_timing()
    assert timing["decode/compiles"] == 1 and timing["decode_forwards"] == 9
    assert "prefill_s" not in compiled.take_timing()  # taken: the sums start again
