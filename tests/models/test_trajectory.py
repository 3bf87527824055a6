"""Trajectories through the model, per family, on real tiny models: an observation turn is what
the chat template writes (hand-checked), encoded on its own it gives exactly the tokens and media
tensors the processor gives the whole trajectory, positions equal the ones the model's own
forward computes over the whole trajectory (get_rope_index with every grid in order), and the
naive and shared-prefix layouts give the logprobs of that whole-trajectory forward."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.data.media import Video
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import (_rope_index_fn, prompt_and_completion_positions,
                                       shared_prefix_logprobs)
from mmrl.models.tiny_tokenizer import CHAT_TEMPLATE
from mmrl.models.trajectory import (encode_observation, observation_messages, observation_style,
                                    observation_text, policy_token_mask)
from mmrl.types import PromptFeatures, Sample

POSITION_FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni"]
# A Qwen3-VL-style tool role: tool messages become one user turn of <tool_response> blocks.
TOOL_ROLE_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>{{ message['role'] }}{{ '\\n' }}",
    "{%- if message['role'] == 'tool' -%}<|im_start|>user{{ '\\n' }}<tool_response>{{ '\\n' }}"
    "{%- else -%}<|im_start|>{{ message['role'] }}{{ '\\n' }}{%- endif -%}").replace(
    "<|im_end|>{{ '\\n' }}{%- endfor -%}",
    "{%- if message['role'] == 'tool' -%}{{ '\\n' }}</tool_response>{%- endif -%}"
    "<|im_end|>{{ '\\n' }}{%- endfor -%}")


@functools.lru_cache(maxsize=None)
def tiny(family: str):
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0)
    return adapter, model, processor


def sine(seconds: float) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * 16000)) / 16000)).astype(np.float32)


def clip(n: int = 4, fps: float = 2.0) -> Video:
    rng = np.random.default_rng(n)
    return Video(frames=rng.integers(0, 256, (n, 56, 56, 3), dtype=np.uint8), fps=fps,
                 timestamps=[3 + i / fps for i in range(n)], duration=10.0)


def observation_media(family: str, k: int) -> tuple[list[dict], dict]:
    """Observation k's result: an image first, then a video (audio for Omni)."""
    if k == 0:
        return ([{"type": "image"}, {"type": "text", "text": "crop 1"}],
                {"images": [Image.fromarray(np.random.default_rng(7).integers(
                    0, 256, (84, 112, 3), dtype=np.uint8))]})
    if family == "qwen2_5_omni":
        return [{"type": "audio"}, {"type": "text", "text": "0.5-1.5 s"}], {"audios": [sine(1.0)]}
    return [{"type": "video"}, {"type": "text", "text": "3-5 s"}], {"videos": [clip()]}


def trajectory(family: str, turns=("Let me look. <tool_call>a</tool_call>",
                                   "Closer. <tool_call>b</tool_call>", "<answer>B</answer>")):
    """(prompt, completion ids [L], observations, full text, full media): 3 model turns with an
    image observation and a video (Omni: audio) observation between them."""
    adapter, model, processor = tiny(family)
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (56, 84, 3), dtype=np.uint8))
    sample = Sample(id="t", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Which colour?"}]}])
    prompt = adapter.prompt_features(processor, sample, [image])
    pieces, observations = [], []
    text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    media = {"images": [image], "videos": [], "audios": []}
    style = observation_style(processor)
    for k, turn in enumerate(turns):
        ids = torch.tensor(tok.encode(turn, add_special_tokens=False) + [eos])
        pieces.append(ids)
        text += tok.decode(ids)
        if k == len(turns) - 1:
            break
        content, items = observation_media(family, k)
        start = sum(len(p) for p in pieces)
        obs_ids, obs = encode_observation(Codec(adapter, processor), [content], items, "<|im_end|>", start,
                                          style)
        pieces.append(obs_ids)
        observations.append(obs)
        text += obs.text
        for kind, values in items.items():
            media[kind] += values
    return prompt, torch.cat(pieces), observations, text, media


def test_an_observation_turn_is_what_the_template_writes():
    _, _, processor = tiny("qwen2_5_vl")
    style = observation_style(processor)
    assert (style.role, style.wrap) == ("user", True)  # the tiny (= Qwen2.5-VL) template: no tool role
    results = [[{"type": "image"}], [{"type": "text", "text": "Error (bad_box): outside"}]]
    assert observation_text(processor, observation_messages(results, style), "<|im_end|>") == (
        "\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>\n"
        "</tool_response>\n<tool_response>\nError (bad_box): outside\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    processor.chat_template = TOOL_ROLE_TEMPLATE
    try:
        style = observation_style(processor)
        assert (style.role, style.wrap) == ("tool", False)
        assert observation_text(processor, observation_messages(results[:1], style), "<|im_end|>") == (
            "\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n")
        # A model turn that ended on another token keeps the template's own end of turn.
        assert observation_text(processor, observation_messages(results[:1], style),
                                "<|endoftext|>").startswith("<|im_end|>\n<|im_start|>user")
    finally:
        processor.chat_template = CHAT_TEMPLATE


@pytest.mark.parametrize("family", POSITION_FAMILIES)
def test_observations_encoded_alone_equal_the_whole_trajectory_processed(family):
    adapter, _, processor = tiny(family)
    prompt, completion, observations, text, media = trajectory(family)
    whole = adapter.encode(processor, text, media["images"], media["videos"] or None,
                           media["audios"] or None)
    assert torch.equal(whole["input_ids"][0], torch.cat([prompt.input_ids, completion]))
    from mmrl.models.trajectory import completion_token_types, row_media
    rows = row_media(prompt.tensors, observations)
    for key, value in rows.items():
        assert torch.equal(whole[key], value), key
    if "mm_token_type_ids" in whole:
        types = torch.cat([prompt.tensors["mm_token_type_ids"][0],
                           completion_token_types(observations, len(completion))])
        assert torch.equal(whole["mm_token_type_ids"][0], types)


def _forward_positions(model, inputs: dict) -> torch.Tensor:
    """The positions the model's own forward computes (its get_rope_index, recorded)."""
    owner = _rope_index_fn(model).__self__
    seen = []
    original = owner.get_rope_index

    def record(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out[0])
        return out

    owner.get_rope_index = record
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        del owner.get_rope_index
    return seen[0][:, 0]


@pytest.mark.parametrize("family", POSITION_FAMILIES)
def test_positions_equal_get_rope_index_over_the_whole_trajectory(family):
    adapter, model, processor = tiny(family)
    prompt, completion, observations, text, media = trajectory(family)
    ours = prompt_and_completion_positions(model, prompt, len(completion), completion, observations)
    whole = adapter.encode(processor, text, media["images"], media["videos"] or None,
                           media["audios"] or None)
    assert torch.equal(ours, _forward_positions(model, whole))
    # The trap this guards: text after an observation's image does not continue at the image's
    # first position + its token count (what extending positions turn by turn would give).
    obs = observations[0]
    p = prompt.input_ids.shape[0] + obs.start
    image = (obs.tensors.get("mm_token_type_ids", torch.zeros(0)) == 1).nonzero()
    if len(image):
        first, last = p + int(image[0]), p + int(image[-1])
        assert ours[0, last + 1] == ours[:, first:last + 1].max() + 1
        assert ours[0, last + 1] != ours[0, first] + (last - first + 1)


@pytest.mark.parametrize("family", [*POSITION_FAMILIES, "qwen2_audio"])
def test_both_layouts_give_the_whole_trajectory_logprobs(family):
    """Three trajectories of one prompt (3 turns, 3 turns, 1 turn): the naive and the
    shared-prefix layouts equal a forward over each whole trajectory processed as one sequence,
    on the model's tokens, to 1e-5."""
    adapter, model, processor = tiny(family)
    if family == "qwen2_audio":
        return _audio_only(adapter, model, processor)
    a = trajectory(family)
    b = trajectory(family, turns=("Hm. <tool_call>c</tool_call>", "Again <tool_call>d</tool_call>",
                                  "<answer>A</answer>"))
    # Answered at once (no observation), and longer than b's first turn and image: its tokens
    # must not take b's image positions (a packer reusing the last row's positions would).
    c = trajectory(family, turns=("The dot is small and the card is grey. " * 6
                                  + "<answer>C</answer>",))
    prompt = a[0]
    # A row without observations after rows with them: it keeps the group's own positions.
    rows, obs = [prompt, prompt, prompt], [a[2], b[2], c[2]]
    ids, mask = _pad([a[1], b[1], c[1]], processor.tokenizer.pad_token_id)
    policy = policy_token_mask(mask, obs)
    assert int(policy.sum()) < int(mask.sum())  # observations are not the policy's tokens
    with torch.no_grad():
        naive = completion_logprobs(model, collate(rows, ids, mask, processor.tokenizer.pad_token_id,
                                                   observations=obs), ids, policy)
        shared = shared_prefix_logprobs(model, rows, ids, mask, observations=obs,
                                        pad_id=processor.tokenizer.pad_token_id)
        for i, (_, completion, _, text, media) in enumerate((a, b, c)):
            whole = adapter.encode(processor, text, media["images"], media["videos"] or None,
                                   media["audios"] or None)
            logits = model(**whole).logits[0, -len(completion) - 1:-1].float()
            ref = torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]
            m = policy[i, :len(completion)].bool()
            assert (naive[i, :len(completion)] - ref)[m].abs().max() < 1e-5
            assert (shared[i, :len(completion)] - ref)[m].abs().max() < 1e-5


def _audio_only(adapter, model, processor):
    """Qwen2-Audio (1-D RoPE): an audio clip returned mid-trajectory."""
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    sample = Sample(id="a", messages=[{"role": "user", "content": [{"type": "audio"},
                                                                   {"type": "text", "text": "Sound?"}]}])
    prompt = adapter.prompt_features(processor, sample, audios=[sine(2.0)])
    first = torch.tensor(tok.encode("Listen <tool_call>x</tool_call>", add_special_tokens=False) + [eos])
    obs_ids, obs = encode_observation(Codec(adapter, processor), [[{"type": "audio"}]],
                                      {"audios": [sine(0.5)]}, "<|im_end|>", len(first))
    last = torch.tensor(tok.encode("<answer>C</answer>", add_special_tokens=False) + [eos])
    completion = torch.cat([first, obs_ids, last])
    text = (processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
            + tok.decode(first) + obs.text + tok.decode(last))
    whole = adapter.encode(processor, text, audios=[sine(2.0), sine(0.5)])
    assert torch.equal(whole["input_ids"][0], torch.cat([prompt.input_ids, completion]))
    ids, mask = completion[None], torch.ones(1, len(completion), dtype=torch.long)
    policy = policy_token_mask(mask, [[obs]])
    with torch.no_grad():
        naive = completion_logprobs(model, collate([prompt], ids, mask, tok.pad_token_id,
                                                   observations=[[obs]]), ids, policy)
        shared = shared_prefix_logprobs(model, [prompt], ids, mask, observations=[[obs]],
                                        pad_id=tok.pad_token_id)
        logits = model(**whole).logits[0, -len(completion) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]
    m = policy[0].bool()
    assert (naive[0] - ref)[m].abs().max() < 1e-5 and (shared[0] - ref)[m].abs().max() < 1e-5


def _pad(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=pad_id) for r in rows])
    mask = torch.stack([(torch.arange(width) < len(r)).long() for r in rows])
    return ids, mask


def test_a_cut_inside_an_observation_is_refused_not_fed_to_the_model():
    """The forward never sees half an observation: a completion cut inside one (its media then
    unmatched by tokens) raises a clear error instead of the model's 'features and tokens do
    not match'."""
    adapter, model, processor = tiny("qwen2_5_vl")
    prompt, completion, observations, _, _ = trajectory("qwen2_5_vl")
    cut = observations[0].start + 5
    ids = completion[None, :cut]
    with pytest.raises(ValueError, match="a cut inside an observation must drop it and its media"):
        collate([prompt], ids, torch.ones_like(ids), observations=[observations])


def test_the_varlen_kernel_packs_trajectories_too():
    """flash_attention_2's CPU twin (mmrl_prefix_varlen): groups packed pad-free in one row, each
    trajectory's positions and observation media in place."""
    from mmrl.models import prefix_attention

    adapter, model, processor = tiny("qwen2_5_vl")
    a, b = trajectory("qwen2_5_vl"), trajectory("qwen2_5_vl", turns=("Hm. <tool_call>c</tool_call>",
                                                                     "<answer>A</answer>"))
    rows, obs = [a[0], a[0]], [a[2], b[2]]
    ids, mask = _pad([a[1], b[1]], processor.tokenizer.pad_token_id)
    policy = policy_token_mask(mask, obs).bool()
    model.set_attn_implementation(prefix_attention.NAME)
    try:
        with torch.no_grad():
            varlen = shared_prefix_logprobs(model, rows, ids, mask, observations=obs,
                                            pad_id=processor.tokenizer.pad_token_id)
    finally:
        model.set_attn_implementation("sdpa")
    with torch.no_grad():
        naive = completion_logprobs(model, collate(rows, ids, mask, processor.tokenizer.pad_token_id,
                                                   observations=obs), ids, policy)
    assert (varlen - naive)[policy].abs().max() < 1e-5
