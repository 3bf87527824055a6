"""Through the real Trainer on a tiny Qwen2.5-VL: micro-batches cut by a token budget give the
row-count cut's loss and every gradient (shared-prefix and naive layouts, prompts of mixed
lengths), and a frozen vision tower runs once per prompt per step, with the same logprobs,
gradients and updated weights as when it runs in every forward."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from mmrl import config
from mmrl.models.encoder_cache import EncoderCache
from mmrl.train.loop import Trainer

pytestmark = [pytest.mark.integration,  # the test replaces optimizer.step to read the gradients
              pytest.mark.filterwarnings("ignore:Seems like `optimizer.step")]
VARIETY = "rewards=[{name: 'mmrl_test_rewards:char_variety'}]"


@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("cuts")
    return tiny_config(root / "tiny.yaml", root / "data")


def _trainer(tiny_yaml, run_dir, *overrides) -> Trainer:
    return Trainer(config.load(tiny_yaml, [f"log.run_dir={run_dir}", VARIETY,
                                           "train.max_grad_norm=0", *overrides]))


def _mixed_rollout(t: Trainer):
    """3 prompts of different lengths (0, 12 and 40 extra words in the question) x 4 answers."""
    source, prompts = t.prompts, []
    for i, extra in enumerate((0, 12, 40)):
        sample = source.dataset[i]
        messages = copy.deepcopy(sample.messages)
        text = next(p for m in messages if m["role"] == "user" for p in m["content"]
                    if p["type"] == "text")
        text["text"] += " please" * extra
        prompts.append(source.features(dataclasses.replace(sample, messages=messages)))
    assert len({p.tensors["input_ids"].shape[1] for p in prompts}) == 3
    torch.manual_seed(0)
    batch = t.rollout.generate(prompts)
    scores, per = t.scorer.score(batch)
    return batch, scores, per


def _learn(t: Trainer, rollout, step: bool = False) -> tuple[dict, list[dict]]:
    """One `learn` stage -> (metrics, the gradients each iteration's optimizer step received).
    `step=False`: the optimizer does not step, so every cut starts from the same weights."""
    seen, optimizer = [], t.learner.optimizer
    real = type(optimizer).step.__get__(optimizer)

    def capture(*a, **kw):
        seen.append({k: p.grad.clone() for k, p in t.policy.model.named_parameters()
                     if p.grad is not None})
        return real(*a, **kw) if step else None

    optimizer.step = capture
    try:
        return t.learn(*rollout), seen
    finally:
        del optimizer.step


def _assert_same_grads(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys() and len(a) > 20
    for k in a:
        scale = float(a[k].abs().max()) + 1e-12
        assert float((a[k] - b[k]).abs().max()) / scale <= tol, k


@pytest.fixture(scope="module")
def trained_tower(tiny_yaml, tmp_path_factory):
    t = _trainer(tiny_yaml, tmp_path_factory.mktemp("run"))
    yield t, _mixed_rollout(t)
    t.close()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("layout", ["shared", "naive"])
def test_token_budget_micro_batches_give_the_row_count_update(trained_tower, layout, agg):
    t, rollout = trained_tower
    batch, policy = rollout[0], t.policy
    policy.choose_layout(layout == "shared")
    t.learner.algo.agg = agg  # the normaliser reads it, the loss its copy
    t.learner.loss = dataclasses.replace(t.learner.loss, agg=agg)
    policy.max_tokens, policy.micro_batch_size = None, 4
    rows_metrics, (rows_grads,) = _learn(t, rollout)
    longest = max(p.tensors["input_ids"].shape[1] for p in batch.prompts)
    policy.max_tokens = longest + 2 * t.cfg.rollout.max_new_tokens  # the longest group is cut
    cut = policy.micro_batches(batch)
    assert len(cut) >= 3 and len({len(rows) for rows in cut}) > 1, cut
    assert sorted(i for rows in cut for i in rows) == list(range(batch.n))
    budget_metrics, (budget_grads,) = _learn(t, rollout)
    policy.max_tokens = None
    # On-policy the loss is -mean(advantage) ~ 0 (advantages sum to 0 in a group): absolute.
    assert budget_metrics["loss/loss"] == pytest.approx(rows_metrics["loss/loss"], abs=1e-7)
    assert any(k.startswith("model.visual") for k in rows_grads)
    _assert_same_grads(rows_grads, budget_grads, 1e-6)


def test_a_training_tower_is_not_cached_and_the_start_says_so(trained_tower):
    t, _ = trained_tower
    assert not t.policy.encoders.on
    assert t.policy.encoders.summary.startswith("encoders: run in every forward (they train)")


def test_frozen_tower_runs_once_per_prompt_per_step(tiny_yaml, tmp_path):
    """num_iterations=2 and beta > 0: old logprobs, reference logprobs and two update
    iterations (micro-batches of 4 rows cut the groups), the weights stepping in between."""
    t = _trainer(tiny_yaml, tmp_path, "model.freeze=[vision]", "algo.num_iterations=2",
                 "algo.beta=0.04", "train.micro_batch_size=4")
    policy = t.policy
    assert policy.encoders.on, policy.encoders.reason
    assert policy.encoders.summary.startswith("encoders: cached once per step (frozen)")
    policy.fix_reference()
    rollout = _mixed_rollout(t)
    start = (copy.deepcopy(policy.model.state_dict()), copy.deepcopy(t.learner.optimizer.state_dict()),
             copy.deepcopy(t.learner.scheduler.state_dict()))
    calls = []
    towers = [policy.model.model.visual, policy.reference.model.visual]
    hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in towers]
    logps = {}
    for name in ("old_logprobs", "reference_logprobs"):
        fn = getattr(policy, name)
        setattr(policy, name, lambda b, fn=fn, name=name: logps.setdefault(name, []).append(fn(b))
                or logps[name][-1])
    runs = {}
    try:
        for cached in (True, False):
            if not cached:  # what train.cache_frozen_encoders=false builds
                policy.encoders = EncoderCache(policy.model, enabled=False)
                policy.model.load_state_dict(start[0])
                t.learner.optimizer.load_state_dict(start[1])
                t.learner.scheduler.load_state_dict(start[2])
            calls.clear()
            metrics, grads = _learn(t, rollout, step=True)
            runs[cached] = (metrics, grads, len(calls),
                            {k: v.detach().clone() for k, v in policy.model.named_parameters()})
    finally:
        for h in hooks:
            h.remove()
    (m1, g1, n1, p1), (m0, g0, n0, p0) = runs[True], runs[False]
    assert n1 == 3  # one call per prompt, in begin_step
    assert n0 == 2 * 3 + 2 * 3  # old + reference + 2 iterations, 3 micro-batches each
    for name, (with_cache, without) in logps.items():
        assert with_cache is not None and float((with_cache - without).abs().max()) <= 1e-6, name
    assert m1["loss/loss"] == pytest.approx(m0["loss/loss"], abs=1e-7)
    assert len(g1) == len(g0) == 2
    assert not any(k.startswith("model.visual") for k in g1[0])
    for a, b in zip(g1, g0):
        _assert_same_grads(a, b, 1e-6)
    assert max(float((p1[k] - p0[k]).abs().max()) for k in p1) <= 1e-6
    t.close()
