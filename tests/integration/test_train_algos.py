"""The trainer's algorithm hooks on a tiny offline Qwen2.5-VL: KL in the reward with the adaptive
controller, the ProRL reference reset, and micro-batch invariance with the loss knobs on."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl import config
from mmrl.train.loop import Trainer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny_algos")
    return tiny_config(root / "tiny.yaml", root / "data",
                       data={"generate_kwargs": {"n_train": 16, "n_eval": 4}})


def _trainer(tiny_yaml: Path, run_dir: Path, *overrides: str) -> Trainer:
    t = Trainer(config.load(tiny_yaml, [f"log.run_dir={run_dir}", *overrides]))
    t.enable_reference()
    return t


@pytest.mark.parametrize("reset", [0, 1])
def test_kl_in_reward_adaptive_coef_and_reference_reset(tiny_yaml, tmp_path, reset):
    t = _trainer(tiny_yaml, tmp_path, "algo.kl_reward_coef=0.1", "algo.kl_reward_target=0.01",
                 "algo.kl_reward_horizon=100", f"algo.ref_reset_every={reset}")
    first = t.train_step()
    # Step 1: the sampling policy is the reference, so KL is 0 and the adaptive controller
    # lowers the coefficient by the maximal 20 % * n / horizon: .1 * (1 - .2 * 8 / 100).
    assert first["kl_reward/kl"] == pytest.approx(0.0, abs=1e-6)
    assert first["kl_reward/coef"] == pytest.approx(0.1)
    assert t.state_extra["kl_reward_coef"] == pytest.approx(0.1 * (1 - 0.2 * 8 / 100))
    same = all(torch.equal(a, b) for a, b in zip(t.learner.ref_model.parameters(), t.learner.model.parameters()))
    assert same == bool(reset), "the reference is the policy after a reset, the start otherwise"
    second = t.train_step()
    if reset:  # reset after step 1: the policy sampling step 2 is the reference again
        assert second["kl_reward/kl"] == pytest.approx(0.0, abs=1e-6)
        assert (tmp_path / "reference" / "config.json").is_file()
    else:
        assert abs(second["kl_reward/kl"]) > 1e-6
    assert second["kl_reward/coef"] == pytest.approx(t.cfg.algo.kl_reward_coef * (1 - 0.2 * 8 / 100))
    t.close()


def test_micro_batches_equal_one_shot_with_loss_knobs(tiny_yaml, tmp_path):
    """Dual-clip, entropy bonus, k3 clamp and CISPO go through the same global normaliser: the
    gradient accumulated over 4 micro-batches of 2 rows equals one batch of 8."""
    grads = []
    for mb in (8, 2):
        t = _trainer(tiny_yaml, tmp_path / f"mb{mb}", f"train.micro_batch_size={mb}",
                     "algo.agg=seq_mean_token_mean", "algo.dual_clip=3.0", "algo.entropy_coef=0.01",
                     "algo.beta=0.04", "algo.kl_clamp=10.0")
        seen = {}
        step = t.learner.optimizer.step

        def capture(*a, **kw):
            seen.update({k: p.grad.clone() for k, p in t.learner.model.named_parameters() if p.grad is not None})
            return step(*a, **kw)

        t.learner.optimizer.step = capture
        torch.manual_seed(0)
        t.train_step()
        grads.append(seen)
        t.close()
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        scale = float(grads[0][k].abs().max()) + 1e-12
        assert float((grads[0][k] - grads[1][k]).abs().max()) / scale < 1e-5, k
