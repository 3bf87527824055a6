"""Policy-loss variants (dual-clip, entropy bonus, CISPO, GPG, Clip-Cov, KL-Cov) and the loss
normaliser, against hand-computed numbers; and micro-batch invariance with the knobs on."""
import itertools
import math

import pytest
import torch

from mmrl.algos import is_weights, loss_normalizer, policy_loss

ONE = torch.ones(1, 1, dtype=torch.bool)


def test_dual_clip_like_verl():
    # ratio 4, A = -1: PPO max(-A r, -A clip(r, .8, 1.2)) = max(4, 1.2) = 4; dual-clip caps the
    # loss of A < 0 tokens at -A c = 3 (verl/EasyR1 clip_ratio_c = 3).
    logp = torch.tensor([[math.log(4.0)]], requires_grad=True)
    old = torch.zeros(1, 1)
    plain, _ = policy_loss(logp, old, torch.tensor([-1.0]), ONE)
    dual, _ = policy_loss(logp, old, torch.tensor([-1.0]), ONE, dual_clip=3.0)
    assert plain.item() == pytest.approx(4.0) and dual.item() == pytest.approx(3.0)
    dual.backward()
    assert logp.grad.item() == 0.0  # capped: no gradient
    # A > 0 is untouched: max(-4, -1.2) = -1.2 with or without c
    pos, _ = policy_loss(logp.detach(), old, torch.tensor([1.0]), ONE, dual_clip=3.0)
    assert pos.item() == pytest.approx(-1.2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(logp, old, torch.tensor([1.0]), ONE, dual_clip=1.0)


def test_entropy_bonus_like_verl():
    # r = 1, A = 0: the surrogate is 0; loss = -coef * mean entropy = -.01 * (2 + 4) / 2 = -.03
    ent = torch.tensor([[2.0, 4.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    z = torch.zeros(1, 3)
    loss, _ = policy_loss(z, z, torch.tensor([0.0]), mask, agg="token_mean", entropy=ent, entropy_coef=0.01)
    assert loss.item() == pytest.approx(-0.03)
    loss.backward()
    assert ent.grad.flatten().tolist() == pytest.approx([-0.005, -0.005, 0.0])
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(z, z, torch.tensor([0.0]), mask, entropy_coef=0.01)


def test_cispo_like_minimax_m1():
    # logp = log .5, old = log .25 -> r = 2; weight sg(clip(2, 0, 1.28)) = 1.28 (clip_low 1: no
    # lower bound); loss = -A w logp = -1.28 * log .5 = .887228; d loss / d logp = -1.28. PPO
    # would give this token no gradient at all (clipped).
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25)]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), ONE, clip_low=1.0, clip_high=0.28, loss_type="cispo")
    assert loss.item() == pytest.approx(-1.28 * math.log(0.5))
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.28)
    logp.grad = None
    ppo, _ = policy_loss(logp, old, torch.tensor([1.0]), ONE, clip_high=0.28)
    ppo.backward()
    assert logp.grad.item() == 0.0


def test_gpg_loss_like_verl():
    # -A logp, token mean: -(2 * -1 + 2 * -2) / 2 = 3; gradient -A / 2 = -1 per token
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([2.0]), torch.ones(1, 2),
                          agg="token_mean", loss_type="gpg")
    assert loss.item() == pytest.approx(3.0)
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, -1.0]]


# Covariance example: A = [1, -1] per row, logp [[-.1, -2], [-.5, -1]]. Over the 4 tokens
# mean A = 0, mean logp = -.9; cov = (A - 0)(logp + .9) = [[.8, -1.1], [-.4, .1]].
LOGP = [[-0.1, -2.0], [-0.5, -1.0]]
ADV = torch.tensor([1.0, -1.0])


def test_kl_cov_like_verl():
    # cov_ratio .25 of 4 tokens -> k = 1: token (0, 0) (cov .8) gets + coef |logp - old| = .2.
    # old = logp except (0, 0): -.3, so r_00 = e^.2 = 1.221403 (not clipped: KL-Cov never clips).
    # per token: -1.221403 + .2, -1, +1, +1 -> sum -.021403; token_mean / 4 = -.005351
    logp = torch.tensor(LOGP, requires_grad=True)
    old = torch.tensor([[-0.3, -2.0], [-0.5, -1.0]])
    loss, _ = policy_loss(logp, old, ADV, torch.ones(2, 2), agg="token_mean", loss_type="kl_cov",
                          cov={"cov_ratio": 0.25, "kl_cov_coef": 1.0})
    assert loss.item() == pytest.approx((-math.exp(0.2) + 0.2 - 1 + 1 + 1) / 4, abs=1e-6)
    loss.backward()
    # d/dlogp_00 of (-r + |logp - old|) / 4 = (-r + sign(.2)) / 4 = (-1.221403 + 1) / 4
    assert logp.grad[0, 0].item() == pytest.approx((-math.exp(0.2) + 1) / 4, abs=1e-6)


def test_clip_cov_like_verl():
    # r = 1 everywhere (PPO clips nothing). Eligible band (.5, 5): only token (0, 0), cov .8;
    # max(1, int(.25 * 4)) = 1 pick -> its loss and gradient are removed:
    # per token [0, -1, +1, +1] -> token_mean .25; the other tokens keep -A r / 4.
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), ADV, torch.ones(2, 2), agg="token_mean",
                          loss_type="clip_cov", cov={"cov_ratio": 0.25, "cov_lb": 0.5, "cov_ub": 5.0,
                                                     "generator": torch.Generator().manual_seed(0)})
    assert loss.item() == pytest.approx(0.25)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -0.25, 0.25, 0.25])


def test_loss_normalizer():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert loss_normalizer(mask, "token_mean").item() == 3
    assert loss_normalizer(mask.float() * 0.5, "token_mean").item() == 1.5  # float masks are weights
    assert loss_normalizer(mask, "seq_mean_token_mean").item() == 2
    assert loss_normalizer(mask, "seq_mean_token_sum_norm").item() == 2
    with pytest.raises(ValueError, match="unknown agg"):
        loss_normalizer(mask, "mean")


N, L = 7, 6
SPLITS = [(0, 3), (3, 5), (5, 7)]
KNOBS = [dict(dual_clip=1.5), dict(entropy_coef=0.01), dict(loss_type="cispo", clip_low=1.0),
         dict(loss_type="gpg"), dict(beta=0.05, kl_clamp=0.02), dict(seq_is=True)]


@pytest.mark.parametrize("agg,knob", list(itertools.product(
    ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"], KNOBS)))
def test_micro_batches_equal_one_shot_with_knobs(agg, knob):
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(N, L, generator=g) * 4
    logp = (old + torch.randn(N, L, generator=g) * 0.6).requires_grad_(True)  # ratios past 1.5
    ref = old + torch.randn(N, L, generator=g) * 0.2
    ent = (torch.rand(N, L, generator=g) * 3).requires_grad_(True)
    sampler = old + torch.randn(N, L, generator=g) * 0.1
    adv = torch.randn(N, generator=g)
    mask = torch.arange(L) < torch.tensor([6, 2, 0, 4, 5, 1, 3])[:, None]
    knob = dict(knob)
    weights = is_weights(old, sampler, mask, 2.0, level="sequence") if knob.pop("seq_is", False) else None
    kw = {**dict(agg=agg, max_len=L, clip_low=0.2, clip_high=0.28), **knob}

    def call(rows, normalizer=None):
        w = None if weights is None else weights[rows]
        return policy_loss(logp[rows], old[rows], adv[rows], mask[rows], ref_logp=ref[rows],
                           entropy=ent[rows], token_weights=w, normalizer=normalizer, **kw)[0]

    one_shot = call(slice(0, N))
    one_shot.backward()
    zeros = torch.zeros(N, L)  # entropy gets a gradient only with entropy_coef on
    g_logp, g_ent = logp.grad.clone(), zeros if ent.grad is None else ent.grad.clone()
    logp.grad, ent.grad = None, None
    norm = loss_normalizer(mask, agg)
    total = sum(call(slice(lo, hi), norm) for lo, hi in SPLITS)
    total.backward()
    assert abs(total.item() - one_shot.item()) < 1e-6
    assert torch.allclose(logp.grad, g_logp, atol=1e-6, rtol=0)
    assert torch.allclose(zeros if ent.grad is None else ent.grad, g_ent, atol=1e-6, rtol=0)
    assert g_logp.abs().sum() > 0
