"""`mmrl train` with tools, in process, on the visual_search generator and a tiny Qwen2.5-VL with
the real `crop` tool.

A random tiny model never writes a tool call, so the trainer's model is first taught (teacher
forced, once per module: most of the module's ~60 s) to open with a crop call; sampling at
temperature 1 then gives trajectories of one or two turns -- crops that run, broken and
malformed calls, cut second turns. Checked on those: the trainer's
logprobs equal the sampler's on every model token (float32, both layouts), the loss sees only
the model's tokens, parameters change, the step metrics carry the tool metrics, micro-batches do
not change the update, and a run resumed mid-way equals the uninterrupted one."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mmrl import algos, config
from mmrl.models.forward import collate, completion_logprobs
from mmrl.train.loop import Trainer
from mmrl.train.rollout_utils import rollout_records
from mmrl.types import ScoredBatch

CALL = '<tool_call>\n{"name": "crop", "arguments": {"bbox_2d": [0, 0, 20, 20]}}\n</tool_call>'
TOOLS = {"use": [{"name": "crop"}], "max_turns": 2, "max_tokens": 300,
         "max_observation_tokens": 80}


@pytest.fixture(scope="module")
def tool_yaml(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    return tiny_config(
        root / "tools.yaml", root / "data",
        data={"generate": "visual_search", "image_max_pixels": 3136,
              "generate_kwargs": {"n_train": 16, "n_eval": 2, "size": 448, "patch": 24,
                                  "cell": 1}},
        rollout={"max_new_tokens": 90, "temperature": 1.0},
        tools=TOOLS, train={"steps": 2, "save_every": 1})


_TAUGHT: dict = {}  # the taught weights, once per module: every trainer here starts from them


def _trainer(tool_yaml, run_dir, *overrides) -> Trainer:
    t = Trainer(config.load(tool_yaml, [f"log.run_dir={run_dir}", *overrides]))
    if not _TAUGHT:
        _teach_call(t)
        _TAUGHT.update({k: v.detach().clone() for k, v in t.policy.model.state_dict().items()})
    t.policy.model.load_state_dict(_TAUGHT)
    return t


def _teach_call(t: Trainer) -> None:
    """Teacher-force CALL as the first turn on a few training prompts (the model's own tool
    prompt included), until greedy decoding would write it."""
    tok, policy = t.policy.codec.tokenizer, t.policy
    feats = [t.prompts.features(t.prompts.dataset[i]) for i in range(4)]
    ids = torch.tensor([tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]] * 4)
    mask = torch.ones_like(ids)
    inputs = collate(feats, ids, mask, policy.codec.pad_id)
    opt = torch.optim.Adam(policy.model.parameters(), lr=3e-3)
    policy.model.train()
    for _ in range(200):
        loss = -completion_logprobs(policy.model, inputs, ids, mask).mean()
        if float(loss) < 0.01:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.01, f"the tool call was not learnt (loss {float(loss):.2f})"


@pytest.fixture(scope="module")
def stepped(tool_yaml, tmp_path_factory):
    """(trainer, the step's batch, the loss masks the loss saw, parameters before, metrics)."""
    t = _trainer(tool_yaml, tmp_path_factory.mktemp("run"))
    torch.manual_seed(0)
    batch, scores, per, extra = t.sample_batch()
    before = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    seen, loss = [], algos.policy_loss
    algos.policy_loss = lambda inputs, *a, **kw: (seen.append(inputs.mask.cpu()),
                                                  loss(inputs, *a, **kw))[1]
    try:
        metrics = t.learn(batch, scores, per, extra)
    finally:
        algos.policy_loss = loss
    yield t, batch, seen, before, metrics
    t.close()


def test_trajectories_call_the_tool_with_different_turn_counts(stepped):
    _, batch, _, _, metrics = stepped
    turns = {t.turns for t in batch.trajectories}
    assert turns == {1, 2}, turns
    assert any(t.observations for t in batch.trajectories)
    assert metrics["tools/calls/crop"] > 0 and metrics["turns/observation_tokens_mean"] > 0
    for key in ("turns/mean", "tools/error_rate", "turns/cap_frac",
                "tools/errors/malformed"):
        assert key in metrics
    assert metrics["turns/mean"] == sum(t.turns for t in batch.trajectories) / batch.n


def test_rollout_records_carry_each_trajectory_turn_by_turn(stepped):
    t, batch, _, _, _ = stepped
    scores = torch.zeros(batch.n)
    sb = ScoredBatch(rollout=batch, scores=scores, per_reward={}, advantages=scores)
    records = json.loads(json.dumps(rollout_records(sb, batch.n)))  # JSON-able
    for record, traj in zip(records, batch.trajectories):
        assert record["turns"] == traj.turn_texts and record["completion"] == traj.turn_texts[-1]
        assert [c["error"] for c in record["calls"]] == [c.error for c in traj.calls]
        assert [o["length"] for o in record["observations"]] == [o.length
                                                                for o in traj.observations]
    assert any(c["name"] == "crop" and c["error"] is None and len(c["arguments"]["bbox_2d"]) == 4
               for r in records for c in r["calls"])


@pytest.mark.parametrize("shared", [True, False])
def test_trainer_logprobs_equal_the_samplers_on_every_model_token(stepped, shared):
    t, batch, _, before, _ = stepped
    now = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    t.policy.model.load_state_dict(before, strict=False)  # the weights that sampled
    layout = t.policy.shared_prefix
    t.policy.shared_prefix = shared
    try:
        logp = t.policy.logprobs(batch)
    finally:
        t.policy.shared_prefix = layout
        t.policy.model.load_state_dict(now, strict=False)
    model = batch.policy_mask.bool()
    assert bool((batch.completion_mask.bool() & ~model).any()), "no observation tokens"
    # float32: rounding alone. On this taught model (logits up to ~14) a one-off check put each
    # side about as far from its float64 value as from the other, so float32 cannot resolve the
    # issue's 1e-5 here (measured 1.1-1.4e-5, relative to the logprob) whatever the code does;
    # the exact check is the float64 test below.
    gap = ((logp - batch.sampler_logp).abs() / batch.sampler_logp.abs().clamp(min=1))[model]
    assert float(gap.max()) < 2e-5, (float(gap.max()), float(batch.sampler_logp.flatten()[
        ((logp - batch.sampler_logp).abs() * model).flatten().argmax()]))
    assert float(batch.sampler_logp[~model].abs().max()) == 0.0


@pytest.mark.parametrize("shared", [True, False])
def test_in_float64_the_trainer_and_the_sampler_agree_to_rounding(stepped, shared):
    """The parity check that rounding cannot blur: the same trainer, cast to float64, samples
    trajectories with crops returned mid-way, and its training forward (both layouts) gives the
    sampler's logprobs on every model token to 2e-6 (float32 noise alone is ~1e-5 here; what
    remains is likely transformers' rotary tables, computed in float32 in any dtype). A wrong
    position, mask, media tensor or observation token would show at 1e-3 or more. The draw uses
    the HF engine's shared-prefill decode (rollout.shared_prefill), mmrl's own loop, which keeps
    float64 logits; HF's generate() rounds its scores to float32 whatever the model's dtype."""
    t, _, _, before, _ = stepped
    now = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    t.policy.model.load_state_dict(before, strict=False)
    layout, t.policy.shared_prefix = t.policy.shared_prefix, shared
    engine = t.rollout.engine
    engine.shared_prefill = True
    t.policy.model.double()
    try:
        torch.manual_seed(0)
        batch = t.sample_batch()[0]
        logp = t.policy.logprobs(batch)
    finally:
        engine.shared_prefill = False
        t.policy.model.float()
        t.policy.shared_prefix = layout
        t.policy.model.load_state_dict(now, strict=False)
    model = batch.policy_mask.bool()
    assert batch.sampler_logp.dtype == torch.float64
    assert bool((batch.completion_mask.bool() & ~model).any()), "no observation tokens"
    assert any(o.media for tr in batch.trajectories for o in tr.observations), "no crop came back"
    gap = (logp.double() - batch.sampler_logp).abs()[model]
    assert float(gap.max()) < 2e-6, float(gap.max())  # measured 4.7e-7


def test_the_loss_sees_only_the_models_tokens_and_parameters_change(stepped):
    t, batch, seen, before, metrics = stepped
    width = batch.completion_ids.shape[1]
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in seen])
    assert torch.equal(mask.bool(), batch.policy_mask.bool())
    changed = [k for k, v in t.policy.model.named_parameters() if not torch.equal(v, before[k])]
    assert any("language_model" in k for k in changed)
    assert metrics["adv/abs_mean"] > 0


def test_micro_batches_do_not_change_the_update_of_mixed_turn_counts(tool_yaml, tmp_path):
    """The same trajectories (different turn counts) in one micro-batch of 8 rows or 8 of one
    row: the same loss and gradients (compared before the optimizer)."""
    t = _trainer(tool_yaml, tmp_path / "mb", "algo.agg=token_mean")
    for seed in range(1, 11):  # the first draw whose trajectories mix turn counts (kernels and
        torch.manual_seed(seed)  # thread counts change which one)
        batch, scores, per, extra = t.sample_batch()
        if len({tr.turns for tr in batch.trajectories}) > 1:
            break
    assert len({tr.turns for tr in batch.trajectories}) > 1, "10 draws of one turn count"
    state = {k: v.detach().clone() for k, v in t.policy.model.state_dict().items()}
    grads, losses, step = [], [], t.learner.optimizer.step

    def capture(*a, **kw):
        grads[-1].update({k: p.grad.clone() for k, p in t.policy.model.named_parameters()
                          if p.grad is not None})

    t.learner.optimizer.step = capture  # gradients only: the weights stay for the second run
    for mb in (8, 1):
        t.policy.micro_batch_size = mb
        grads.append({})
        losses.append(t.learner.update(
            _scored(t, batch, scores, per), 0)["loss/loss"])
        t.policy.model.load_state_dict(state)
    t.learner.optimizer.step = step
    t.close()
    assert abs(losses[0] - losses[1]) < 1e-6 * max(1.0, abs(losses[0]))
    assert grads[0].keys() == grads[1].keys() and grads[0]
    # Relative per tensor, with a floor at the largest gradient's 1e-7: a tensor whose gradient
    # is 1e-8 (a vision norm) carries float32 summation noise of its own size.
    top = max(float(g.abs().max()) for g in grads[0].values())
    for k in grads[0]:
        bound = 1e-5 * float(grads[0][k].abs().max()) + 1e-7 * top
        assert float((grads[0][k] - grads[1][k]).abs().max()) <= bound, k


def _scored(t: Trainer, batch, scores, per):
    adv = t.scorer.advantages(scores, batch.group_ids, batch.policy_mask.sum(1))
    assert bool(adv.any())
    return ScoredBatch(rollout=batch, scores=scores, per_reward=per, advantages=adv)


def test_a_run_resumed_mid_way_equals_the_uninterrupted_one(tool_yaml, tmp_path):
    """Two steps in one go vs one step, a checkpoint, and a new Trainer that resumes from it:
    the second step's metrics and the final weights are equal."""
    full = _trainer(tool_yaml, tmp_path / "full")
    full.train_step()
    full.save()
    ckpt = full.run_dir / "checkpoints" / "step_000001"
    second = full.train_step()
    weights = {k: v.detach().clone() for k, v in full.policy.model.state_dict().items()}
    full.close()
    cfg = config.load(tool_yaml, [f"log.run_dir={tmp_path / 'resumed'}"])
    resumed = Trainer(cfg, resume=ckpt)
    again = resumed.train_step()
    for key in ("loss/loss", "reward/total_mean", "turns/mean", "tools/calls_mean",
                "turns/observation_tokens_mean"):
        assert again[key] == second[key], key
    for k, v in resumed.policy.model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    resumed.close()
    assert json.loads(json.dumps(second["turns/mean"])) > 0


def test_turn_capped_rows_leave_the_loss_when_asked(stepped):
    """tools.mask_truncated_trajectories: a row that hit the turn cap has an all-zero loss mask;
    the other rows keep their policy mask."""
    t, batch, _, _, _ = stepped
    capped = dataclasses.replace(batch.trajectories[0], hit_turn_cap=True)
    batch = dataclasses.replace(batch, trajectories=[capped, *batch.trajectories[1:]])
    scores = torch.arange(batch.n, dtype=torch.float32)
    seen, loss = [], algos.policy_loss
    algos.policy_loss = lambda inputs, *a, **kw: (seen.append(inputs.mask.cpu()),
                                                  loss(inputs, *a, **kw))[1]
    t.learner.mask_turn_cap = True
    try:
        t.learner.update(_scored(t, batch, scores, {}), 0)
    finally:
        algos.policy_loss, t.learner.mask_turn_cap = loss, False
    mask = torch.cat(seen)
    assert not mask[0].any()
    assert torch.equal(mask[1:].bool(), batch.policy_mask[1:, :mask.shape[1]].bool())


def test_tool_trajectories_run_async_at_k1(tool_yaml, tmp_path):
    """rollout.max_staleness=1: the sampler process runs the same multi-turn loop (model turns,
    crop calls on the original image, observation turns) on its own copy of the weights; the
    trainer's loss weights each model token by pi_prox / pi_behav."""
    t = _trainer(tool_yaml, tmp_path, "rollout.max_staleness=1", "train.steps=3")
    try:
        assert t.sampler is not None and t.sampler.weights.version is None  # taught: unpublished
        calls, seen = 0.0, []
        for _ in range(3):
            metrics = t.train_step()
            calls += metrics.get("tools/calls/crop", 0.0)  # absent in a step without a call
            assert metrics["turns/mean"] >= 1
            seen.append(metrics["async/staleness"])
            assert torch.isfinite(torch.tensor(metrics["loss/loss"]))
        assert calls > 0 and max(seen) <= 1 and metrics["async/requeued"] == 0
        assert metrics["async/staleness_0"] + metrics["async/staleness_1"] == 3
    finally:
        t.close()
