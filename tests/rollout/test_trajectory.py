"""The trajectory loop end to end on a tiny Qwen2.5-VL with the real `crop` tool.

The model is first taught (teacher-forced through the trajectory forward, a few s) one 3-turn
trajectory -- crop, crop again, answer -- so that greedy decoding makes real tool calls; sampling
at temperature 1 then makes calls, broken calls and answers. Checked: the loss mask by hand on
the 3-turn trajectory, the crops are of the original image, sampler logprobs equal the training
forward's in both layouts to 1e-5 (float32) with images returned mid-trajectory, micro-batches
give the same values, and budget cuts, observation caps and the turn cap."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmrl.models.codec import Codec
from mmrl.config import ToolSpec, ToolsConfig
from mmrl.data.media import fit_image
from mmrl.models import get_adapter
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import shared_prefix_logprobs
from mmrl.models.trajectory import encode_observation
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout, TrajectorySettings
from mmrl.tools import Toolbox, as_content, load_tool, trajectory_metrics
from mmrl.tools.builtin import crop
from mmrl.types import RolloutBatch, Sample, SamplingParams

BOXES = ([0, 0, 7, 7], [35, 35, 42, 42])  # input px; 56 x 56 original px each: 4 tokens
TURNS = [f'<tool_call>\n{{"name": "crop", "arguments": {{"bbox_2d": {BOXES[0]}}}}}\n</tool_call>',
         f'<tool_call>\n{{"name": "crop", "arguments": {{"bbox_2d": {BOXES[1]}}}}}\n</tool_call>',
         "<answer>red</answer>"]
BUDGET = 56 * 56  # the model sees the 448-px original at 56 x 56


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(adapter, model, processor, toolbox, prompts): the model taught TURNS on prompt 0."""
    root = tmp_path_factory.mktemp("traj")
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0)
    toolbox = Toolbox([load_tool("crop")], timeout_s=10)
    prompts = []
    for i, colour in enumerate(("red", "blue")):
        original = Image.new("RGB", (448, 448), "white")
        ImageDraw.Draw(original).rectangle([300, 300, 310, 310], fill=colour)
        original.save(root / f"{i}.png")
        # A short prompt keeps the test fast; the tool prompt is tests/tools/test_prompt.py's.
        sample = Sample(id=f"s{i}", images=[str(root / f"{i}.png")], source=f"t.jsonl:{i + 1}",
                        messages=[{"role": "user", "content": [
                            {"type": "image"}, {"type": "text", "text": "Which colour is the dot? "
                                                                        "Use crop."}]}])
        small = fit_image(original, 28 * 28, BUDGET)
        features = adapter.prompt_features(processor, sample, [small])
        features.media = {"images": [small]}
        prompts.append(features)
    _teach(adapter, model, processor, toolbox, prompts[0])
    return adapter, model, processor, toolbox, prompts


def _scripted(adapter, processor, toolbox, prompt):
    """TURNS with the real crop results between them: (ids [L], observations, policy mask)."""
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ctx = toolbox.context(prompt, Codec(adapter, processor))
    pieces, observations, policy = [], [], []
    for k, turn in enumerate(TURNS):
        ids = torch.tensor(tok.encode(turn, add_special_tokens=False) + [eos])
        pieces.append(ids)
        policy.append(torch.ones_like(ids))
        if k < len(BOXES):
            content, media = as_content(crop(ctx, BOXES[k]))
            obs_ids, obs = encode_observation(Codec(adapter, processor), [content], media, "<|im_end|>",
                                              sum(len(p) for p in pieces))
            pieces.append(obs_ids)
            policy.append(torch.zeros_like(obs_ids))
            observations.append(obs)
    return torch.cat(pieces), observations, torch.cat(policy)


def _teach(adapter, model, processor, toolbox, prompt):
    ids, observations, policy = _scripted(adapter, processor, toolbox, prompt)
    ids, policy, mask = ids[None], policy[None], torch.ones(1, len(ids), dtype=torch.long)
    inputs = collate([prompt], ids, mask, processor.tokenizer.pad_token_id,
                     observations=[observations])
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.train()
    for _ in range(90):
        logp = completion_logprobs(model, inputs, ids, policy)
        loss = -(logp * policy).sum() / policy.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert float(loss.detach()) < 0.2


def rollout(setup, prompts, settings=TrajectorySettings(max_turns=3, max_tokens=600,
                                                        max_observation_tokens=300), **sampling):
    adapter, model, processor, toolbox, _ = setup
    loop = TrajectoryRollout(HFEngine(model, processor), Codec(adapter, processor), toolbox, settings)
    params = dict(num_generations=1, max_new_tokens=80, do_sample=False, seed=0,
                  suppress_ids=adapter.placeholder_token_ids(processor))
    return loop.rollout(prompts, SamplingParams(**{**params, **sampling}))


def logprobs(setup, batch: RolloutBatch, temperature: float, shared: bool) -> torch.Tensor:
    _, model, processor, _, _ = setup
    pad = processor.tokenizer.pad_token_id
    with torch.no_grad():
        if shared:
            return shared_prefix_logprobs(model, batch.prompts, batch.completion_ids,
                                          batch.completion_mask, temperature=temperature,
                                          pad_id=pad, observations=batch.observations())
        inputs = collate(batch.prompts, batch.completion_ids, batch.completion_mask, pad,
                         observations=batch.observations())
        return completion_logprobs(model, inputs, batch.completion_ids, batch.policy_mask,
                                   temperature=temperature)


def test_three_turns_with_the_real_crop_tool_and_the_loss_mask_by_hand(setup):
    adapter, _, processor, toolbox, prompts = setup
    batch = rollout(setup, prompts[:1])
    (t,) = batch.trajectories
    assert t.turn_texts == TURNS and batch.texts == [TURNS[-1]] and t.turns == 3
    assert [(c.name, c.arguments["bbox_2d"], c.error, c.turn) for c in t.calls] == [
        ("crop", BOXES[0], None, 0), ("crop", BOXES[1], None, 1)]
    assert not t.hit_turn_cap and not bool(batch.truncated[0])
    # Each observation holds the crop of the ORIGINAL: box x8 (56 -> 448 px), under the budget.
    ctx = toolbox.context(prompts[0], Codec(adapter, processor))
    for obs, box in zip(t.observations, BOXES):
        expected = fit_image(Image.open(prompts[0].sample.images[0]).convert("RGB").crop(
            tuple(8 * v for v in box)), *ctx.image_pixels)
        assert np.array_equal(np.asarray(obs.media["images"][0]), np.asarray(expected))
    # The loss mask by hand: model turns are their own tokens + <|im_end|>; an observation is
    # the processor's tokens for its text and image alone.
    tok = processor.tokenizer
    turn_lengths = [len(tok.encode(text, add_special_tokens=False)) + 1 for text in TURNS]
    obs_lengths = [adapter.encode(processor, o.text, images=o.media["images"])["input_ids"].shape[1]
                   for o in t.observations]
    expected = [1] * turn_lengths[0] + [0] * obs_lengths[0] + [1] * turn_lengths[1] \
        + [0] * obs_lengths[1] + [1] * turn_lengths[2]
    assert batch.loss_mask[0].tolist() == expected
    assert batch.completion_mask[0].tolist() == [1] * len(expected)
    assert (batch.sampler_logp[0][batch.loss_mask[0] == 0] == 0).all()
    assert (batch.sampler_logp[0][batch.loss_mask[0] == 1] < 0).all()
    assert [o.start for o in t.observations] == [turn_lengths[0],
                                                 turn_lengths[0] + obs_lengths[0] + turn_lengths[1]]
    m = trajectory_metrics(batch.trajectories)
    assert (m["turns/mean"], m["tools/calls/crop"], m["tools/error_rate"]) == (3.0, 2.0, 0.0)
    assert m["turns/observation_tokens_mean"] == sum(obs_lengths)


@pytest.fixture(scope="module")
def sampled(setup):
    """G = 4 sampled trajectories for each of two prompts, temperature 1."""
    return rollout(setup, setup[4], num_generations=4, do_sample=True, temperature=1.0, seed=3)


def test_sampled_trajectories_call_break_and_answer(sampled):
    turns = [t.turns for t in sampled.trajectories]
    assert max(turns) >= 2 and sampled.n == 8
    assert sampled.group_ids.tolist() == [0] * 4 + [1] * 4
    with_images = [t for t in sampled.trajectories if any("images" in o.media for o in t.observations)]
    assert with_images, "some trajectory must get an image back mid-trajectory"


@pytest.mark.parametrize("shared", [False, True], ids=["naive", "shared_prefix"])
def test_sampler_logprobs_equal_the_training_forward(setup, sampled, shared):
    logp = logprobs(setup, sampled, 1.0, shared)
    m = sampled.policy_mask.bool()
    assert (logp - sampled.sampler_logp)[m].abs().max() < 1e-5
    # Micro-batches of any rows give the same values (rows carry their own observations).
    for rows in ([0, 5], [7, 2, 3]):
        part = logprobs(setup, sampled.select(rows), 1.0, shared)
        width = part.shape[1]
        assert (part - logp[rows, :width])[m[rows, :width]].abs().max() < 1e-5


def test_a_budget_cut_at_an_observation_drops_it_and_its_media(setup):
    adapter, model, processor, _, prompts = setup
    full = rollout(setup, prompts[:1]).trajectories[0]
    second = full.observations[1]
    # Room for everything up to the second observation, but not for it and one more token.
    budget = second.start + second.length
    batch = rollout(setup, prompts[:1], TrajectorySettings(max_turns=3, max_tokens=budget,
                                                           max_observation_tokens=300))
    (t,) = batch.trajectories
    assert bool(batch.truncated[0]) and t.turns == 2 and len(t.observations) == 1
    assert len(t.calls) == 2  # the second crop ran; its observation did not fit
    inputs = collate(batch.prompts, batch.completion_ids, batch.completion_mask,
                     processor.tokenizer.pad_token_id, observations=batch.observations())
    patches = prompts[0].tensors["pixel_values"].shape[0] + t.observations[0].tensors[
        "pixel_values"].shape[0]
    assert inputs["pixel_values"].shape[0] == patches  # the dropped image is not there either
    assert (logprobs(setup, batch, 1.0, False) - batch.sampler_logp)[batch.policy_mask.bool()].abs().max() < 1e-5


def test_an_observation_over_its_cap_comes_back_as_an_error(setup):
    _, _, processor, _, prompts = setup
    batch = rollout(setup, prompts[:1], TrajectorySettings(max_turns=2, max_tokens=600,
                                                           max_observation_tokens=20))
    (t,) = batch.trajectories
    assert [c.error for c in t.calls] == ["too_long"]
    (obs,) = t.observations  # the error itself always goes back, whatever the cap
    assert "pixel_values" not in obs.tensors and "Error (too_long)" in obs.text
    assert "over the limit of 20" in obs.text and t.turns == 2


def test_the_turn_cap_ends_a_trajectory_that_still_calls(setup):
    batch = rollout(setup, setup[4][:1], TrajectorySettings(max_turns=2, max_tokens=600,
                                                            max_observation_tokens=300))
    (t,) = batch.trajectories
    assert t.hit_turn_cap and t.turns == 2 and len(t.calls) == 1 and len(t.observations) == 1
    assert batch.hit_turn_cap.tolist() == [True]
    assert not bool(batch.truncated[0])
    tools = ToolsConfig(use=[ToolSpec(name="crop")], max_turns=2, eval_max_turns=6)
    assert TrajectorySettings.from_config(tools).max_turns == 2
    adapter, model, processor, _, _ = setup
    loop = TrajectoryRollout.from_config(tools, HFEngine(model, processor), Codec(adapter, processor),
                                         evaluation=True)
    assert loop.settings.max_turns == 6 and list(loop.toolbox.tools) == ["crop"]


def test_trajectory_and_single_turn_batches_concatenate(setup, sampled):
    single = RolloutBatch(prompts=sampled.prompts[:2], completion_ids=torch.ones(2, 3, dtype=torch.long),
                          completion_mask=torch.ones(2, 3, dtype=torch.long),
                          group_ids=torch.tensor([9, 9]), sampler_logp=torch.zeros(2, 3),
                          texts=["a", "b"], truncated=torch.tensor([False, True]))
    both = RolloutBatch.cat([sampled, single], pad_id=0)
    width = both.completion_ids.shape[1]
    assert both.n == 10 and both.loss_mask[8:].tolist() == [[1, 1, 1] + [0] * (width - 3)] * 2
    assert [t.turn_texts for t in both.trajectories[8:]] == [["a"], ["b"]]
    assert torch.equal(both.select([0, 1]).loss_mask, sampled.loss_mask[[0, 1]])
    assert RolloutBatch.cat([single, single], pad_id=0).loss_mask is None  # single-turn stays so


def test_compiled_decode_gives_the_same_trajectories(setup, monkeypatch):
    """Multi-turn continuations through the compiled static-cache step (dynamo's eager backend:
    tests/models/test_compiled_decode.py says why): each turn a new prompt width, the same
    greedy trajectory as HF's generate, a few compiled shapes."""
    from mmrl.models import compiled_decode

    monkeypatch.setattr(compiled_decode, "BACKEND", "eager")
    adapter, model, processor, toolbox, prompts = setup
    settings = TrajectorySettings(max_turns=3, max_tokens=600, max_observation_tokens=300)
    engine = HFEngine(model, processor, compile_decode="compiled")
    params = SamplingParams(num_generations=1, max_new_tokens=80, do_sample=False, seed=0,
                            suppress_ids=adapter.placeholder_token_ids(processor))
    compiled = TrajectoryRollout(engine, Codec(adapter, processor), toolbox, settings).rollout(
        prompts[:1], params)
    eager = rollout(setup, prompts[:1])
    assert compiled.trajectories[0].turn_texts == eager.trajectories[0].turn_texts == TURNS
    assert torch.equal(compiled.completion_ids, eager.completion_ids)
    stats = engine.take_timing()
    assert 1 <= stats["decode/compiles"] <= 3 and stats["decode/recompiles"] == 0
    assert stats["decode_forwards"] > 0
