"""Advantage estimators against hand-computed numbers.

Running example (rows interleaved, ids non-contiguous and unsorted):
    row:    0  1  2  3  4  5  6
    id:     7  3  7  7  3  7 -5
    score:  1  0  0  1  0  1  4
group 7 = [1, 0, 1, 1]: mean 0.75, deviations +.25 (x3) and -.75,
    sum of squares = 3 * 0.0625 + 0.5625 = 0.75, unbiased var = 0.75 / 3 = 0.25, std = 0.5
group 3 = [0, 0]: constant -> 0.   group -5 = [4]: singleton -> 0.
"""
import math

import pytest
import torch

from mmrl.algos import ADVANTAGES, compute_advantages

SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 4.0])
IDS = torch.tensor([7, 3, 7, 7, 3, 7, -5])


def approx(values, abs=1e-6):
    return pytest.approx(values, abs=abs)


def test_registry_names():
    assert sorted(ADVANTAGES) == ["dr_grpo", "gpg", "grpo", "grpo_passk", "reinforce", "reinforce_pp", "rloo"]


def test_grpo_hand_computed():
    # (1 - .75) / .5 = .5 ; (0 - .75) / .5 = -1.5 ; eps = 1e-6 moves these by < 4e-6
    adv = ADVANTAGES["grpo"](SCORES, IDS)
    assert adv.tolist() == approx([0.5, 0, -1.5, 0.5, 0, 0.5, 0], abs=4e-6)
    assert adv.dtype == torch.float32


def test_grpo_uses_unbiased_std():
    # group [0, 1]: mean .5, unbiased std = sqrt(.5) -> adv = +-.5 / .70711 = +-.70711
    # (a population std of .5 would give +-1)
    adv = ADVANTAGES["grpo"](torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), eps=0.0)
    assert adv.tolist() == approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_dr_grpo_hand_computed():
    adv = ADVANTAGES["dr_grpo"](SCORES, IDS)
    assert adv.tolist() == approx([0.25, 0, -0.75, 0.25, 0, 0.25, 0])


def test_rloo_hand_computed():
    # r = 1: others [0, 1, 1] mean 2/3 -> 1/3 ; r = 0: others [1, 1, 1] mean 1 -> -1
    adv = ADVANTAGES["rloo"](SCORES, IDS)
    assert adv.tolist() == approx([1 / 3, 0, -1, 1 / 3, 0, 1 / 3, 0])


def test_reinforce_pp_hand_computed():
    # centred c = [.25, 0, -.75, .25, 0, .25, 0]; batch mean 0; sum c^2 = .75 over N = 7 rows,
    # unbiased batch var = .75 / 6 = .125, std = sqrt(.125) = .353553
    adv = ADVANTAGES["reinforce_pp"](SCORES, IDS)
    s = math.sqrt(0.125)
    assert adv.tolist() == approx([0.25 / s, 0, -0.75 / s, 0.25 / s, 0, 0.25 / s, 0], abs=2e-5)


def test_reinforce_pp_whitens_across_groups():
    # groups [0, 2] and [0, 4]: c = [-1, 1, -2, 2], batch unbiased var = 10 / 3
    adv = ADVANTAGES["reinforce_pp"](torch.tensor([0.0, 2, 0, 4]), torch.tensor([1, 1, 2, 2]), eps=0)
    s = math.sqrt(10 / 3)
    assert adv.tolist() == approx([-1 / s, 1 / s, -2 / s, 2 / s])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_degenerate_groups_give_finite_zeros(name):
    # 0.1 * 3 / 3 != 0.1 in float: constant groups must still give exact zeros, not err / eps.
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7])
    adv = ADVANTAGES[name](scores, torch.tensor([4, 4, 4, 9]))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    one = ADVANTAGES[name](torch.tensor([3.0]), torch.tensor([0]))
    assert one.tolist() == [0.0]
    empty = ADVANTAGES[name](torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_grouping_is_by_id_not_position(name):
    perm = torch.tensor([6, 2, 0, 5, 1, 4, 3])
    base = ADVANTAGES[name](SCORES, IDS)
    shuffled = ADVANTAGES[name](SCORES[perm], IDS[perm])
    assert torch.allclose(shuffled, base[perm], atol=1e-6)
    # relabelling ids changes nothing either
    relabeled = ADVANTAGES[name](SCORES, IDS * 1000 + 17)
    assert torch.allclose(relabeled, base, atol=1e-6)


def test_integer_and_float64_scores():
    adv = ADVANTAGES["dr_grpo"](torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 0, 0]))
    assert adv.dtype == torch.float32 and adv.tolist() == approx([0.25, -0.75, 0.25, 0.25])
    adv64 = ADVANTAGES["dr_grpo"](torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]))
    assert adv64.dtype == torch.float64


def test_compute_advantages_and_errors():
    assert compute_advantages("rloo", SCORES, IDS).tolist() == approx([1 / 3, 0, -1, 1 / 3, 0, 1 / 3, 0])
    with pytest.raises(KeyError, match="unknown advantage"):
        compute_advantages("nope", SCORES, IDS)
    with pytest.raises(ValueError, match="equal length"):
        ADVANTAGES["grpo"](SCORES, IDS[:3])
