"""DAPO dynamic sampling / overlong filtering, and the log-prob / entropy helpers."""
import math

import pytest
import torch

from mmrl.algos import (
    GroupAccumulator,
    entropy_from_logits,
    frac_zero_std_groups,
    group_has_signal,
    groups_with_signal,
    overlong_filter_mask,
    selective_log_softmax,
)

# group 7 = [1, 0, 1, 1] (signal), group 3 = [0, 0] (none), group -5 = [4] (singleton: none)
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 4.0])
IDS = torch.tensor([7, 3, 7, 7, 3, 7, -5])


def test_group_has_signal_rows():
    assert group_has_signal(SCORES, IDS).tolist() == [True, False, True, True, False, True, False]


def test_group_has_signal_is_eps_tolerant():
    scores = torch.tensor([0.5, 0.5 + 1e-9, 0.0, 0.3], dtype=torch.float64)
    assert group_has_signal(scores, torch.tensor([1, 1, 2, 2])).tolist() == [False, False, True, True]
    assert group_has_signal(scores, torch.tensor([1, 1, 2, 2]), eps=0.0).tolist() == [True] * 4


def test_groups_with_signal_and_fraction():
    ids, keep = groups_with_signal(SCORES, IDS)
    assert ids.tolist() == [-5, 3, 7] and keep.tolist() == [False, False, True]
    assert frac_zero_std_groups(SCORES, IDS) == pytest.approx(2 / 3)
    assert frac_zero_std_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0
    assert isinstance(frac_zero_std_groups(SCORES, IDS), float)


def test_accumulator_reaches_target_and_drops_surplus():
    acc = GroupAccumulator(target_groups=3, max_rounds=3)
    assert acc.add(["a", "b", "c"], torch.tensor([True, False, False])) == 1
    assert not acc.full and acc.round == 1
    assert acc.add([{"g": 4}, "e", ("f",)], [True, True, True]) == 3
    assert acc.full and acc.round == 2 and acc.kept == 4 and acc.seen == 6
    assert acc.take() == ["a", {"g": 4}, "e"]
    acc.reset()
    assert acc.kept == 0 and acc.round == 0 and not acc.full


def test_accumulator_raises_after_max_rounds():
    acc = GroupAccumulator(target_groups=5, max_rounds=2)
    acc.add([0, 1, 2], torch.tensor([False, True, False]))
    with pytest.raises(RuntimeError) as err:
        acc.add([3, 4], torch.tensor([False, False]))
    msg = str(err.value)
    assert "2 rounds" in msg and "only 1 of the 5" in msg
    assert "Lower the target" in msg and "disable dynamic sampling" in msg


def test_accumulator_errors():
    with pytest.raises(ValueError):
        GroupAccumulator(0, 3)
    acc = GroupAccumulator(2, 3)
    with pytest.raises(ValueError, match="flags"):
        acc.add([1, 2], [True])
    with pytest.raises(RuntimeError, match="not full"):
        acc.take()


def test_overlong_filter_mask():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    truncated = torch.tensor([False, True, False])
    out = overlong_filter_mask(mask, truncated)
    assert out.dtype == torch.bool and out.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert mask[1].all()  # input untouched
    fout = overlong_filter_mask(mask.float() * 0.5, truncated)
    assert fout.dtype == torch.float32 and fout.tolist() == [[0.5, 0.5, 0], [0, 0, 0], [0.5, 0, 0]]
    with pytest.raises(ValueError):
        overlong_filter_mask(mask, truncated[:2])


def test_selective_log_softmax_matches_log_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, requires_grad=True)
    index = torch.randint(0, 11, (3, 5), generator=g)
    got = selective_log_softmax(logits, index, chunk_rows=4)  # 15 rows: chunks 4, 4, 4, 3
    want = logits.log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    assert torch.allclose(got, want, atol=1e-6)
    (g1,) = torch.autograd.grad(got.sum(), logits)
    (g2,) = torch.autograd.grad(want.sum(), logits)
    assert torch.allclose(g1, g2, atol=1e-6)
    # hand value: logits [0, log 3] -> p = [1/4, 3/4]
    two = torch.tensor([[0.0, math.log(3)]])
    assert selective_log_softmax(two, torch.tensor([1])).item() == pytest.approx(math.log(0.75))


def test_selective_log_softmax_bf16_is_accurate():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 1000, generator=g) * 5).bfloat16()
    index = torch.randint(0, 1000, (8,), generator=g)
    got = selective_log_softmax(logits, index)
    want = logits.float().log_softmax(-1).gather(-1, index[:, None]).squeeze(-1)
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5)


def test_entropy_from_logits():
    # uniform over 4 -> log 4; p = [1/4, 3/4] -> -(.25 ln .25 + .75 ln .75) = .562335;
    # a -inf logit is an impossible token and changes nothing
    logits = torch.tensor([[0.0, 0, 0, 0], [0.0, math.log(3), float("-inf"), float("-inf")]], requires_grad=True)
    h = entropy_from_logits(logits, chunk_rows=1)
    assert h.tolist() == pytest.approx([math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], abs=1e-6)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 3, 50, generator=g)
    p = z.softmax(-1)
    assert torch.allclose(entropy_from_logits(z), -(p * p.log()).sum(-1), atol=1e-5)
