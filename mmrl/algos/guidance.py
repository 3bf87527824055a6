"""Ground truth as off-policy guidance (TempSamp-R1). Pure; torch + stdlib only.

When no sample of a group is good (its best reward is below a threshold), the trainer replaces
one rollout by the ground-truth answer, written in the recipe's answer format; its logprobs come
from the current policy. Its reward is then far above the group's, and plain group
normalisation would let that one row dominate the update, so the rewards of a guided group are
first reshaped asymmetrically around a pivot ``tau``: above it they are log-compressed (the
off-policy row still wins, by less), below it exp-stretched (on-policy failures stay apart)::

    r >= tau:  tau + ln(1 + a (r - tau)) / a
    r <  tau:  tau - (exp(b (tau - r)) - 1) / b          (a, b -> 0: the identity)

Both branches have slope 1 at ``tau``, so the map is smooth and monotone. This follows the
paper's description of its non-linear soft advantage (compress the off-policy reward, keep the
on-policy spread); the constants are ours, not the paper's code.

>>> import torch
>>> s = torch.tensor([0.2, 0.0, 1.0, 1.0]); g = torch.tensor([0, 0, 1, 1])
>>> guidance_rows(s, g, threshold=0.5).tolist()
[False, True, False, False]
>>> [round(x, 6) for x in soft_rewards(torch.tensor([1.5, 0.0]), tau=1.0).tolist()]
[1.405465, -0.718282]
"""
from __future__ import annotations


import torch
from torch import Tensor


def guidance_rows(scores: Tensor, group_ids: Tensor, threshold: float) -> Tensor:
    """Bool[N]: the last row (by position) of every group whose max score < threshold."""
    if scores.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(f"scores and group_ids must be 1-D of equal length; got "
                         f"{tuple(scores.shape)} and {tuple(group_ids.shape)}")
    ids, inv = torch.unique(group_ids, return_inverse=True)
    r = scores.detach().to(torch.float64)
    gmax = r.new_zeros(ids.numel()).scatter_reduce_(0, inv, r, "amax", include_self=False)
    pos = torch.arange(scores.numel())
    last = pos.new_zeros(ids.numel()).scatter_reduce_(0, inv, pos, "amax", include_self=False)
    out = torch.zeros(scores.numel(), dtype=torch.bool)
    out[last[gmax < threshold]] = True
    return out


def soft_rewards(scores: Tensor, tau: float = 1.0, alpha_pos: float = 1.0,
                 alpha_neg: float = 1.0) -> Tensor:
    """The asymmetric reshaping above (elementwise; same dtype as scores)."""
    r = scores.to(torch.float64)
    d = r - tau
    up = d if alpha_pos == 0 else torch.log1p(alpha_pos * d.clamp(min=0)) / alpha_pos
    down = d if alpha_neg == 0 else -(torch.expm1(alpha_neg * (-d).clamp(min=0))) / alpha_neg
    out = tau + torch.where(d >= 0, up, down)
    return out.to(scores.dtype if scores.is_floating_point() else torch.float32)


def in_guided_groups(guided: Tensor, group_ids: Tensor) -> Tensor:
    """Bool[N]: rows whose group holds a guided row."""
    return torch.isin(group_ids, group_ids[guided])


def soft_guided_scores(scores: Tensor, group_ids: Tensor, guided: Tensor, tau: float,
                       alpha_pos: float, alpha_neg: float) -> Tensor:
    """Scores with the guided groups reshaped by ``soft_rewards``; other groups unchanged."""
    shaped = soft_rewards(scores, tau, alpha_pos, alpha_neg)
    return torch.where(in_guided_groups(guided, group_ids), shaped, scores)


