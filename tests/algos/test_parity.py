"""Advantage, KL and off-policy-correction knobs against hand-computed numbers (issue: parity
with verl / TRL). Each case spells its arithmetic out; the peer it matches is named."""
import math

import pytest
import torch

from mmrl.algos import (KLController, compute_advantages, is_weights, kl_in_reward, kl_penalty,
                        weight_by_sign)
from mmrl.algos.advantages import ADVANTAGES


def approx(values, abs=1e-5):
    return pytest.approx(values, abs=abs)


def test_reinforce_pp_whitens_over_tokens_like_verl():
    # Issue repro. c = r - mean_g = [.5, -.5, .5, -.5]; tokens carry c_i len_i times:
    # T = 6, mu = (.5 - 1.5 + .5 - .5) / 6 = -1/6; c - mu = [2/3, -1/3, 2/3, -1/3];
    # var = (2 * 4/9 + 4 * 1/9) / 5 = 4/15 (unbiased over tokens); A = (c - mu) / sqrt(4/15)
    # = [sqrt(15)/3, -sqrt(15)/6, ...] = [1.291, -0.645, 1.291, -0.645] (verl's numbers).
    adv = ADVANTAGES["reinforce_pp"](torch.tensor([1.0, 0, 1, 0]), torch.tensor([1, 1, 2, 2]),
                                     lengths=torch.tensor([1, 3, 1, 1]), eps=0.0)
    s = math.sqrt(15)
    assert adv.tolist() == approx([s / 3, -s / 6, s / 3, -s / 6])
    assert adv.tolist() == approx([1.291, -0.645, 1.291, -0.645], abs=1e-3)
    # Equal lengths: the old per-row whitening (rows weigh the same), c = +-.5, var = 1/3
    rows = ADVANTAGES["reinforce_pp"](torch.tensor([1.0, 0, 1, 0]), torch.tensor([1, 1, 2, 2]),
                                      lengths=torch.tensor([2, 2, 2, 2]), eps=0.0)
    # tokens: 8 values +-.5, mu 0, var = 8 * .25 / 7 = 2/7
    assert rows.tolist() == approx([0.5 / math.sqrt(2 / 7), -0.5 / math.sqrt(2 / 7)] * 2)


def test_grpo_scale_rewards_group_batch_none_like_trl():
    # scores [1, 0 | 0, 0]: centred [.5, -.5, 0, 0]
    s, g = torch.tensor([1.0, 0, 0, 0]), torch.tensor([1, 1, 2, 2])
    # group: std of [1, 0] = sqrt(.5) -> +-.70711
    assert ADVANTAGES["grpo"](s, g, eps=0.0).tolist() == approx([0.70711, -0.70711, 0, 0])
    # batch (TRL scale_rewards="batch"): std of [1, 0, 0, 0], mean .25,
    # sum sq = .5625 + 3 * .0625 = .75, unbiased var .75 / 3 = .25, std .5 -> [1, -1, 0, 0]
    assert compute_advantages("grpo", s, g, eps=0.0, scale="batch").tolist() == approx([1, -1, 0, 0])
    assert compute_advantages("grpo", s, g, scale="none").tolist() == approx([0.5, -0.5, 0, 0])
    with pytest.raises(ValueError, match="unknown scale"):
        compute_advantages("grpo", s, g, scale="rows")


def test_options_an_estimator_does_not_take_are_errors():
    s, g = torch.tensor([1.0, 0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="takes no option scale"):
        compute_advantages("rloo", s, g, scale="batch")
    assert compute_advantages("rloo", s, g, scale=None).tolist() == approx([1, -1])  # None: not passed


def test_gpg_advantage_like_verl():
    # alpha = N / #nonzero scores = 4 / 1; centred [.5, -.5, 0, 0] -> alpha * c / f_norm
    s, g = torch.tensor([1.0, 0, 0, 0]), torch.tensor([1, 1, 2, 2])
    assert ADVANTAGES["gpg"](s, g).tolist() == approx([2, -2, 0, 0])
    assert compute_advantages("gpg", s, g, f_norm=2.0).tolist() == approx([1, -1, 0, 0])


def test_passk_advantage_like_verl_grpo_passk():
    # group a = [.2, 1, .5, 0]: best row 1, second best .5, gap .5; mean .425,
    # deviations [-.225, .575, .075, -.425], sum sq .5675, unbiased var .189167, std .434933
    # -> A_1 = .5 / .434933 = 1.149603; every other row 0. group b = [0, 0]: gap 0.
    s = torch.tensor([0.2, 1.0, 0.5, 0.0, 0.0, 0.0])
    g = torch.tensor([5, 5, 5, 5, 9, 9])
    adv = ADVANTAGES["grpo_passk"](s, g, eps=0.0)
    assert adv.tolist() == approx([0, 1.149603, 0, 0, 0, 0])
    assert compute_advantages("grpo_passk", s, g, scale="none").tolist() == approx([0, 0.5, 0, 0, 0, 0])
    # a tie for the best goes to the first row; the gap to the second best (also 1) is 0
    tie = ADVANTAGES["grpo_passk"](torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 0]))
    assert tie.tolist() == [0.0, 0.0, 0.0]


def test_sign_weighting_w_reinforce_psr_nsr():
    adv = torch.tensor([1.0, -2.0, 0.0])
    assert weight_by_sign(adv, 0.1, 1.0).tolist() == approx([0.1, -2.0, 0.0])  # W-REINFORCE
    assert weight_by_sign(adv, 1.0, 0.0).tolist() == [1.0, 0.0, 0.0]  # PSR
    assert weight_by_sign(adv, 0.0, 1.0).tolist() == [0.0, -2.0, 0.0]  # NSR
    assert weight_by_sign(adv) is adv  # default: untouched
    assert ADVANTAGES["reinforce"](torch.tensor([1.0, -1.0]), torch.tensor([0, 0])).tolist() == [1.0, -1.0]


def test_k3_clamp_like_verl():
    # d = ref - logp = 15: k3 = e^15 - 16 = 3269001.4; verl clamps to 10
    lp, ref = torch.tensor([0.0, 0.0]), torch.tensor([15.0, 0.5])
    assert kl_penalty(lp, ref, "k3")[0].item() == pytest.approx(math.exp(15) - 16, rel=1e-6)
    clamped = kl_penalty(lp, ref, "k3", clamp=10.0)
    # second token: e^.5 - .5 - 1 = 0.148721, under the clamp
    assert clamped.tolist() == approx([10.0, math.exp(0.5) - 1.5])


def test_kl_in_reward_and_adaptive_controller_like_verl():
    # k1 = logp - ref: row 0 [.5, -1] -> sum -.5; row 1 [-.5] (second token masked) -> -.5
    logp = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0], [-0.5, 9.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    scores, kl = kl_in_reward(torch.tensor([1.0, 0.0]), logp, ref, mask, coef=0.1, kind="k1")
    assert scores.tolist() == approx([1.05, 0.05])  # r - .1 * sum_t KL_t
    assert kl.item() == pytest.approx((-0.25 + -0.5) / 2)  # mean of per-row token means
    # verl AdaptiveKLController: e = clip(.1 / .05 - 1, -.2, .2) = .2; coef *= 1 + .2 * 10 / 100
    ctl = KLController(0.1, target=0.05, horizon=100)
    assert ctl.update(0.1, 10) == pytest.approx(0.102)
    assert ctl.update(0.0, 10) == pytest.approx(0.102 * 0.98)  # e = clip(-1) = -.2
    fixed = KLController(0.1)
    assert fixed.update(5.0, 10) == 0.1
    with pytest.raises(ValueError, match="target > 0"):
        KLController(0.1, target=0.0)


def test_sequence_and_masked_importance_weights_like_verl_rollout_is():
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    smp = torch.tensor([[-1.5, -2.5, 0.0]])
    m = torch.tensor([[1, 1, 0]])
    e = math.exp
    # token ratios e^.5 each (1.6487 < cap 2)
    assert is_weights(old, smp, m, 2.0).flatten().tolist() == approx([e(0.5), e(0.5), 0])
    # sequence: product e^(.5 + .5) = 2.718 -> truncated at 2 on every token of the row
    assert is_weights(old, smp, m, 2.0, level="sequence").flatten().tolist() == approx([2, 2, 0])
    # geometric: e^(mean .5) = 1.6487
    assert is_weights(old, smp, m, 2.0, level="geometric").flatten().tolist() == approx([e(0.5), e(0.5), 0])
    # mask (rejection): 2.718 > cap -> the whole sequence gets weight 0
    assert is_weights(old, smp, m, 2.0, level="sequence", mode="mask").tolist() == [[0, 0, 0]]
    # token mask: ratios [e^1, 1, e^-1]; e^1 > 2 and e^-1 = .368 < 1/2 are rejected, 1 kept
    w = is_weights(torch.tensor([[0.0, 0.0, -1.0]]), torch.tensor([[-1.0, 0.0, 0.0]]),
                   torch.ones(1, 3), 2.0, mode="mask")
    assert w.tolist() == [[0.0, 1.0, 0.0]]
    # an explicit lower threshold keeps e^-1
    w = is_weights(torch.tensor([[-1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), 2.0, mode="mask", lower=0.3)
    assert w.flatten().tolist() == approx([e(-1)])
    with pytest.raises(ValueError, match="level/mode"):
        is_weights(old, smp, m, 2.0, level="row")


def test_algos_imports_only_torch_and_the_standard_library():
    # DESIGN.md: mmrl/algos is pure. Check every module's imports statically.
    import ast
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2] / "mmrl" / "algos"
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ok = (top in ("torch", "__future__") or top in sys.stdlib_module_names
                      or name.startswith("mmrl.algos"))
                assert ok, f"{path.name} imports {name}"
