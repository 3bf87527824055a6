"""Micro-batched accumulation equals the one-shot loss (DESIGN.md: "a unit test, not a hope").

The trainer splits N rows into micro-batches and passes normalizer = global valid-token count
(token_mean) or global N (seq_* modes); the sum of micro-batch losses and the accumulated
gradients must equal one call on the whole batch.
"""
import itertools

import pytest
import torch

from mmrl.algos import loss_normalizer, policy_loss

N, L = 7, 6
SPLITS = [(0, 3), (3, 5), (5, 7)]  # uneven on purpose


def batch():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(N, L, generator=g) * 4
    logp = (old + torch.randn(N, L, generator=g) * 0.3).requires_grad_(True)
    ref = old + torch.randn(N, L, generator=g) * 0.2
    adv = torch.randn(N, generator=g)
    lengths = torch.tensor([6, 2, 0, 4, 5, 1, 3])  # row 2 is fully masked
    mask = torch.arange(L) < lengths[:, None]
    return logp, old, ref, adv, mask


@pytest.mark.parametrize(
    "agg,ratio,beta",
    list(itertools.product(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
                           ["token", "sequence"], [0.0, 0.05])),
)
def test_micro_batches_equal_one_shot(agg, ratio, beta):
    logp, old, ref, adv, mask = batch()
    kw = dict(agg=agg, ratio=ratio, beta=beta, ref_logp=ref, kl="k3", max_len=L, clip_low=0.2, clip_high=0.28)

    one_shot, _ = policy_loss(logp, old, adv, mask, **kw)
    one_shot.backward()
    grad_one_shot, logp.grad = logp.grad.clone(), None

    normalizer = loss_normalizer(mask, agg)  # what the trainer passes (summed over processes)
    total = 0.0
    for lo, hi in SPLITS:
        mb_kw = dict(kw, ref_logp=ref[lo:hi])
        loss, metrics = policy_loss(logp[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi], normalizer=normalizer, **mb_kw)
        loss.backward()  # gradients accumulate into logp.grad, as in the trainer
        total = total + loss.detach()
        assert ("kl" in metrics) == (beta > 0)

    assert abs(total.item() - one_shot.item()) < 1e-6
    assert torch.allclose(logp.grad, grad_one_shot, atol=1e-6, rtol=0)
    assert grad_one_shot.abs().sum() > 0
    assert grad_one_shot[2].abs().sum() == 0  # the fully masked row contributes nothing


def test_micro_batch_metrics_are_local():
    # ratio_max of the second micro-batch is its own maximum, not the global one.
    logp, old, ref, adv, mask = batch()
    _, whole = policy_loss(logp, old, adv, mask)
    _, part = policy_loss(logp[3:5], old[3:5], adv[3:5], mask[3:5], normalizer=mask.sum())
    r = (logp - old).exp()[3:5][mask[3:5]]
    assert part["ratio_max"] == pytest.approx(r.max().item(), rel=1e-6)
    assert part["ratio_mean"] == pytest.approx(r.mean().item(), rel=1e-6)
    assert whole["ratio_max"] >= part["ratio_max"]
