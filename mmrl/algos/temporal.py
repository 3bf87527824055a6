"""Temporal contrast, T-GRPO (Video-R1, Feng et al. 2025). Pure; torch + stdlib only.

Each video prompt is sampled twice: with its frames in order (the group trained on) and with its
frames shuffled (a second group, only scored). When the ordered group's accuracy ``p`` is at
least ``mu`` times the shuffled group's ``p~`` (Video-R1's code: ``acc_mean >= 0.8 *
shuffled_acc_mean``), the ordered group's correct samples (accuracy > ``correct_above``, 0.1 in
Video-R1) get the bonus ``alpha`` (0.3 in Video-R1): reasoning that uses the order is paid more.
In the example, group 0 loses (p = .5 < .8 * 1) and group 1 wins (p = 1 >= .8 * 0):

>>> import torch
>>> acc = torch.tensor([1., 0., 1., 1.]); g = torch.tensor([0, 0, 1, 1])
>>> sacc = torch.tensor([1., 1., 0., 0.]); sg = torch.tensor([0, 0, 1, 1])
>>> [round(x, 4) for x in temporal_bonus(acc, g, sacc, sg, alpha=0.3, mu=0.8).tolist()]
[0.0, 0.0, 0.3, 0.3]
"""
from __future__ import annotations

import torch
from torch import Tensor


def _group_means(x: Tensor, group_ids: Tensor) -> dict[int, float]:
    ids, inv = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(ids.numel(), dtype=torch.float64).index_add_(0, inv, x.to(torch.float64))
    counts = torch.bincount(inv, minlength=ids.numel()).to(torch.float64)
    return {int(i): float(s / c) for i, s, c in zip(ids, sums, counts)}


def temporal_bonus(acc: Tensor, group_ids: Tensor, shuffled_acc: Tensor, shuffled_group_ids: Tensor,
                   alpha: float = 0.3, mu: float = 0.8, correct_above: float = 0.1) -> Tensor:
    """Float[N]: ``alpha`` for correct rows of ordered groups with ``p >= mu * p~``, else 0.

    Shuffled rows carry the group id of their ordered group; ordered groups without shuffled
    rows (no video) get no bonus.
    """
    if acc.shape != group_ids.shape or shuffled_acc.shape != shuffled_group_ids.shape:
        raise ValueError("acc/group_ids and shuffled_acc/shuffled_group_ids must pair up")
    p, p_shuf = _group_means(acc, group_ids), _group_means(shuffled_acc, shuffled_group_ids)
    wins = torch.tensor([int(g) in p_shuf and p[int(g)] >= mu * p_shuf[int(g)]
                         for g in group_ids.tolist()], dtype=torch.bool)
    return torch.where(wins & (acc > correct_above), torch.tensor(float(alpha)), torch.tensor(0.0))


def contrast_win_frac(acc: Tensor, group_ids: Tensor, shuffled_acc: Tensor,
                      shuffled_group_ids: Tensor, mu: float = 0.8) -> float:
    """Share of the contrasted groups where ``p >= mu * p~`` (logged; 0.0 with none)."""
    p, p_shuf = _group_means(acc, group_ids), _group_means(shuffled_acc, shuffled_group_ids)
    shared = [g for g in p_shuf if g in p]
    return sum(p[g] >= mu * p_shuf[g] for g in shared) / len(shared) if shared else 0.0
