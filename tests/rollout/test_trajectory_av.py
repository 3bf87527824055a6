"""Tools that return video frames and audio clips go through the same trajectory loop: a tiny
Qwen2.5-VL calls `frames` on a real mp4 and a tiny Qwen2-Audio calls `audio_clip` on a real wav
(each first taught one 2-turn trajectory), the observation carries the returned media, and the
sampler's logprobs equal the training forward's in both layouts."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.models.codec import Codec
from mmrl.data.media import load_audio, load_video
from mmrl.data.synthetic_av import write_mp4, write_wav
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import shared_prefix_logprobs
from mmrl.models.trajectory import encode_observation
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.tools import ToolCall, Toolbox, as_content, load_tool
from mmrl.types import Sample, SamplingParams

CASES = {  # family -> (tool, its call's arguments, media kind, observation tensor key)
    "qwen2_5_vl": ("frames", {"start": 1, "end": 3}, "videos", "pixel_values_videos"),
    "qwen2_audio": ("audio_clip", {"start": 0.5, "end": 1.5}, "audios", "input_features"),
}


def media_file(root, kind: str) -> str:
    if kind == "videos":
        frames = np.stack([np.full((56, 56, 3), 20 * k, np.uint8) for k in range(12)])
        write_mp4(root / "clip.mp4", frames, 4)
        return str(root / "clip.mp4")
    t = np.arange(32000) / 16000
    write_wav(root / "tone.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    return str(root / "tone.wav")


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family = request.param
    tool, arguments, kind, key = CASES[family]
    # Taught for 120 steps: at 60 the audio model still garbled its call's JSON.
    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=0)
    tok = processor.tokenizer
    path = media_file(tmp_path_factory.mktemp(family), kind)
    sample = Sample(id="m", source="t.jsonl:1", **{kind: [path]}, messages=[{"role": "user", "content": [
        {"type": kind[:-1]}, {"type": "text", "text": f"What is there? Use {tool}."}]}])
    media = ({"videos": [load_video(path, fps=1.0)]} if kind == "videos"
             else {"audios": [load_audio(path)]})
    prompt = adapter.prompt_features(processor, sample, **media)
    prompt.media = media
    toolbox = Toolbox([load_tool(tool)])
    turns = [f'<tool_call>{json.dumps({"name": tool, "arguments": arguments})}</tool_call>',
             "<answer>B</answer>"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    first = torch.tensor(tok.encode(turns[0], add_special_tokens=False) + [eos])
    outcome = toolbox.run([(ToolCall(tool, arguments), toolbox.context(prompt, Codec(adapter, processor)),
                            [tool])])[0]
    assert outcome.error is None, outcome.message
    content, items = as_content(outcome.items)
    obs_ids, obs = encode_observation(Codec(adapter, processor), [content], items, "<|im_end|>", len(first))
    last = torch.tensor(tok.encode(turns[1], add_special_tokens=False) + [eos])
    ids = torch.cat([first, obs_ids, last])[None]
    policy = torch.cat([torch.ones_like(first), torch.zeros_like(obs_ids), torch.ones_like(last)])[None]
    inputs = collate([prompt], ids, torch.ones_like(ids), tok.pad_token_id, observations=[[obs]])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(120):
        loss = -(completion_logprobs(model, inputs, ids, policy) * policy).sum() / policy.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    loop = TrajectoryRollout(HFEngine(model, processor), Codec(adapter, processor), toolbox,
                             TrajectorySettings(max_turns=2, max_tokens=500,
                                                max_observation_tokens=400))
    return adapter, model, processor, loop, prompt, turns, tool, key


def test_the_loop_returns_frames_and_clips(case):
    adapter, model, processor, loop, prompt, turns, tool, key = case
    batch = loop.rollout([prompt], SamplingParams(num_generations=1, max_new_tokens=100,
                                                  do_sample=False, suppress_ids=adapter.placeholder_token_ids(processor)))
    (t,) = batch.trajectories
    assert t.turn_texts == turns and [(c.name, c.error) for c in t.calls] == [(tool, None)]
    (obs,) = t.observations
    assert key in obs.tensors  # the returned media reach the forward


@pytest.mark.parametrize("shared", [False, True], ids=["naive", "shared_prefix"])
def test_sampled_trajectories_match_the_training_forward(case, shared):
    adapter, model, processor, loop, prompt, _, _, key = case
    batch = loop.rollout([prompt], SamplingParams(num_generations=4, max_new_tokens=100, seed=5,
                                                  temperature=1.0,
                                                  suppress_ids=adapter.placeholder_token_ids(processor)))
    assert any(key in o.tensors for t in batch.trajectories for o in t.observations)
    pad = processor.tokenizer.pad_token_id
    with torch.no_grad():
        if shared:
            logp = shared_prefix_logprobs(model, batch.prompts, batch.completion_ids,
                                          batch.completion_mask, pad_id=pad, temperature=1.0,
                                          observations=batch.observations())
        else:
            logp = completion_logprobs(model, collate(batch.prompts, batch.completion_ids,
                                                      batch.completion_mask, pad,
                                                      observations=batch.observations()),
                                       batch.completion_ids, batch.policy_mask, temperature=1.0)
    m = batch.policy_mask.bool()
    assert (logp - batch.sampler_logp)[m].abs().max() < 1e-5

