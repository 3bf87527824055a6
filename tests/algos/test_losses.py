"""policy_loss and kl_penalty against hand-computed numbers.

Running example (token ratio), clip_low = 0.2, clip_high = 0.28:
    row 0: A = +1, mask [1, 1, 0], r = [1.5, 1.1, (padding)]
        t0: r = 1.5 > 1.28 -> clipped (high): -min(1.5, 1.28) = -1.28
        t1: r = 1.1        -> -1.1
    row 1: A = -1, mask [1, 1, 1], r = [0.5, 1.0, 0.9]
        t0: r = 0.5 < 0.8  -> clipped (low): -min(-0.5, -0.8) = 0.8
        t1: 1.0 ;  t2: 0.9
    token sums: row 0 = -2.38, row 1 = 2.7 ; valid tokens 2 + 3 = 5
    token_mean              = (-2.38 + 2.7) / 5          = 0.064
    seq_mean_token_mean     = (-2.38/2 + 2.7/3) / 2      = (-1.19 + 0.9) / 2 = -0.145
    seq_mean_token_sum_norm = (-2.38/4 + 2.7/4) / 2      = 0.04      (max_len = 4)
    clip_frac_high = 1/5, clip_frac_low = 1/5, ratio mean = 5/5 = 1, min .5, max 1.5
"""
import math

import pytest
import torch

from mmrl.algos import kl_penalty, policy_loss

LN = math.log


def example(dtype=torch.float32):
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -3.0]], dtype=dtype)
    log_r = torch.tensor([[LN(1.5), LN(1.1), 60.0], [LN(0.5), 0.0, LN(0.9)]], dtype=dtype)
    logp = (old + log_r).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    return logp, old, adv, mask


@pytest.mark.parametrize(
    "agg,expected", [("token_mean", 0.064), ("seq_mean_token_mean", -0.145), ("seq_mean_token_sum_norm", 0.04)]
)
def test_token_ratio_aggregations(agg, expected):
    logp, old, adv, mask = example()
    loss, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg=agg, max_len=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["clip_frac_high"] == pytest.approx(0.2)
    assert m["clip_frac_low"] == pytest.approx(0.2)
    assert (m["ratio_mean"], m["ratio_min"], m["ratio_max"]) == pytest.approx((1.0, 0.5, 1.5))
    assert "kl" not in m and all(isinstance(v, float) for v in m.values())


def test_token_ratio_gradients():
    # d l_t / d logp_t = -A r_t where unclipped, 0 where clipped; token_mean divides by 5.
    logp, old, adv, mask = example()
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()
    expected = torch.tensor([[0.0, -1.1, 0.0], [0.0, 1.0, 0.9]]) / 5
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_float_mask_equals_bool_mask():
    logp, old, adv, mask = example()
    a, _ = policy_loss(logp, old, adv, mask, agg="seq_mean_token_mean")
    b, _ = policy_loss(logp, old, adv, mask.float(), agg="seq_mean_token_mean")
    assert a.item() == b.item()


def test_clip_higher_asymmetry():
    # r = 1.25 with A = +1: inside [0.8, 1.28] -> unclipped (-1.25, grad flows);
    # with symmetric 0.2 it is clipped to 1.2 (grad 0). r = 0.75 with A = -1 is clipped low by 0.2.
    # r = 0.5 with A = +1 is below 1 - clip_low but the min picks r*A: not clipped, grad flows.
    old = torch.zeros(1, 3)
    logp = torch.tensor([[LN(1.25), LN(0.75), LN(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0]])  # per-token advantages [N, L] are accepted too
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token_mean")
    assert loss.item() == pytest.approx((-1.25 + 0.8 - 0.5) / 3, abs=1e-6)
    assert (m["clip_frac_high"], m["clip_frac_low"]) == pytest.approx((0.0, 1 / 3))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.25, 0.0, -0.5]]) / 3, atol=1e-6)

    logp.grad = None
    loss, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 0.5) / 3, abs=1e-6)
    assert (m["clip_frac_high"], m["clip_frac_low"]) == pytest.approx((1 / 3, 1 / 3))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, -0.5]]) / 3, atol=1e-6)


def seq_example():
    # row 0: A = +1, valid log-ratios [0.2, 0.0] -> s0 = exp(0.1) = 1.105171
    # row 1: A = -1, valid log-ratios [-0.3, 0.0, 0.0] -> s1 = exp(-0.1) = 0.904837
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    log_r = torch.tensor([[0.2, 0.0, -50.0], [-0.3, 0.0, 0.0]])
    logp = (old + log_r).requires_grad_(True)
    return logp, old, torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1, 0], [1, 1, 1]])


def test_sequence_ratio_hand_computed():
    logp, old, adv, mask = seq_example()
    s0, s1 = math.exp(0.1), math.exp(-0.1)
    # unclipped (both within [0.8, 1.2]): every valid token of row 0 has loss -s0, of row 1 +s1
    loss, m = policy_loss(logp, old, adv, mask, ratio="sequence", agg="token_mean")
    assert loss.item() == pytest.approx((-2 * s0 + 3 * s1) / 5, abs=1e-6)
    assert (m["ratio_min"], m["ratio_max"]) == pytest.approx((s1, s0))
    assert m["ratio_mean"] == pytest.approx((2 * s0 + 3 * s1) / 5)
    loss, _ = policy_loss(logp, old, adv, mask, ratio="sequence", agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-6)
    # clip_high = 0.05: s0 = 1.105 > 1.05 clipped -> row 0 loses -1.05 per token; row 1 unchanged
    loss, m = policy_loss(logp, old, adv, mask, ratio="sequence", clip_high=0.05, agg="seq_mean_token_sum_norm", max_len=4)
    assert loss.item() == pytest.approx((-1.05 * 2 / 4 + s1 * 3 / 4) / 2, abs=1e-6)
    assert (m["clip_frac_high"], m["clip_frac_low"]) == pytest.approx((2 / 5, 0.0))


def gspo_direct(logp, old, adv, mask, agg, clip_low, clip_high, max_len):
    """The per-sequence GSPO objective written directly: s_i = exp(mean_t (logp - old))."""
    lengths = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / lengths.clamp(min=1))
    per_seq = torch.maximum(-adv * s, -adv * s.clamp(1 - clip_low, 1 + clip_high))
    if agg == "token_mean":
        return (per_seq * lengths).sum() / lengths.sum()
    if agg == "seq_mean_token_mean":
        return per_seq.sum() / len(s)
    return (per_seq * lengths / max_len).sum() / len(s)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gspo_gradient_matches_direct_formulation(agg):
    g = torch.Generator().manual_seed(0)
    N, L = 6, 7
    old = -torch.rand(N, L, generator=g, dtype=torch.float64) * 3
    # rows 0/1 are pushed far outside the clip range (clipped high / low); rows 2-5 stay inside
    shift = torch.tensor([0.3, -0.3, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)[:, None]
    base = old + shift + torch.randn(N, L, generator=g, dtype=torch.float64) * 0.01
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(L) < lengths[:, None]).double()
    adv = torch.tensor([1.0, -1.0, 0.7, -0.4, 1.3, -2.0], dtype=torch.float64)
    kw = dict(agg=agg, clip_low=0.05, clip_high=0.08, max_len=L)
    a = base.clone().requires_grad_(True)
    loss, m = policy_loss(a, old, adv, mask, ratio="sequence", **kw)
    loss.backward()
    b = base.clone().requires_grad_(True)
    ref = gspo_direct(b, old, adv, mask, **kw)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert a.grad.abs().sum() > 0  # some sequences are unclipped, so the test is not vacuous
    assert m["clip_frac_high"] == pytest.approx(7 / 26) and m["clip_frac_low"] == pytest.approx(3 / 26)
    assert a.grad[:2].abs().sum() == 0 and (a.grad[2:].abs().sum(-1) > 0).all()


def test_kl_estimators_hand_computed():
    # logp = log .5, ref = log .25: logp - ref = log 2 = .693147
    # k1 = .693147, k2 = .5 * .693147^2 = .240227, k3 = exp(-log 2) + log 2 - 1 = .193147
    # reversed (logp = log .25, ref = log .5): k1 = -.693147, k2 = .240227, k3 = 2 - log 2 - 1 = .306853
    logp = torch.tensor([LN(0.5), LN(0.25)])
    ref = torch.tensor([LN(0.25), LN(0.5)])
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([LN(2), -LN(2)], abs=1e-6)
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.5 * LN(2) ** 2] * 2, abs=1e-6)
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx([0.5 + LN(2) - 1, 2 - LN(2) - 1], abs=1e-6)
    with pytest.raises(ValueError, match="unknown kl"):
        kl_penalty(logp, ref, "k4")


def test_kl_gradients():
    # d k1/d logp = 1 ; d k2/d logp = logp - ref ; d k3/d logp = 1 - exp(ref - logp)
    logp = torch.tensor([LN(0.5)], requires_grad=True)
    ref = torch.tensor([LN(0.25)])
    for kind, expected in (("k1", 1.0), ("k2", LN(2)), ("k3", 0.5)):
        logp.grad = None
        kl_penalty(logp, ref, kind).sum().backward()
        assert logp.grad.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_added_per_token_before_aggregation(kind):
    # r = 1 and A = 0 -> the PG term is 0, so loss = beta * aggregated KL.
    # row 0: logp - ref = [log 2, -log 2], row 1: [log 2, (pad)]
    ref = torch.tensor([[LN(0.25), LN(0.5)], [LN(0.25), 0.0]])
    logp = torch.tensor([[LN(0.5), LN(0.25)], [LN(0.5), -80.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    k = {"k1": (LN(2), -LN(2)), "k2": (0.5 * LN(2) ** 2,) * 2, "k3": (0.5 + LN(2) - 1, 2 - LN(2) - 1)}[kind]
    token_kl = [k[0], k[1], k[0]]
    loss, m = policy_loss(logp, logp.detach(), torch.zeros(2), mask, ref_logp=ref, beta=0.1, kl=kind)
    assert loss.item() == pytest.approx(0.1 * sum(token_kl) / 3, abs=1e-6)
    assert m["kl"] == pytest.approx(sum(token_kl) / 3, abs=1e-6)
    loss, _ = policy_loss(logp, logp.detach(), torch.zeros(2), mask, ref_logp=ref, beta=0.1, kl=kind, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(0.1 * ((k[0] + k[1]) / 2 + k[0]) / 2, abs=1e-6)


def test_all_masked_rows_no_nan():
    logp = torch.tensor([[float("-inf"), -1.0], [-2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[0.0, -1.2], [-2.1, 0.0]])
    ref = torch.tensor([[5.0, -1.0], [-2.0, float("inf")]])
    mask = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        for ratio in ("token", "sequence"):
            logp.grad = None
            loss, m = policy_loss(logp, old, torch.tensor([1.0, 2.0]), mask, agg=agg, ratio=ratio,
                                  ref_logp=ref, beta=0.04, max_len=2)
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
            assert all(math.isfinite(v) for v in m.values())
            assert logp.grad[0].tolist() == [0.0, 0.0]
    # everything masked: loss 0, neutral metrics
    loss, m = policy_loss(logp, old, torch.ones(2), torch.zeros(2, 2), ref_logp=ref, beta=0.1)
    assert loss.item() == 0.0 and m["ratio_mean"] == 1.0 and m["clip_frac_low"] == 0.0 and m["kl"] == 0.0


def test_bf16_inputs_are_upcast():
    logp, old, adv, mask = example()
    loss, _ = policy_loss(logp.bfloat16(), old.bfloat16(), adv, mask, clip_low=0.2, clip_high=0.28)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(0.064, abs=2e-2)


def test_argument_errors():
    logp, old, adv, mask = example()
    with pytest.raises(ValueError, match="max_len"):
        policy_loss(logp, old, adv, mask, agg="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="unknown agg"):
        policy_loss(logp, old, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="unknown ratio"):
        policy_loss(logp, old, adv, mask, ratio="seq")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="unknown kl"):
        policy_loss(logp, old, adv, mask, beta=0.1, ref_logp=old, kl="k9")
    with pytest.raises(ValueError, match="adv"):
        policy_loss(logp, old, adv[:1], mask)
