"""Outcome advantages for group-sampled RL (GRPO family).

Every estimator has the signature ``fn(scores[N], group_ids[N], eps=1e-6) -> adv[N]`` and is
registered in ``ADVANTAGES`` under its name. Rows are grouped by ``group_ids`` (arbitrary ints,
any order, gaps allowed), never by position, so a trainer may shuffle or filter rows freely.

Shared conventions (so every estimator is safe on degenerate groups):

* a group of one gives advantage 0 (there is nothing to compare against);
* a group whose scores are all equal gives exactly 0, even where ``sum / n`` rounds off the
  common value (otherwise ``(r - mean) / (0 + eps)`` would turn a rounding error into ~0.1);
* no Python loop over groups: ``torch.unique(return_inverse=True)`` + ``index_add_``.

Statistics are computed in float64 (N is small; this keeps hand-checked numbers exact) and the
result is returned in the scores' floating dtype (float32 for integer/bool scores).

Example (group 7 = [1, 0, 1, 1], group 3 = [0, 0], interleaved):

>>> import torch
>>> s = torch.tensor([1., 0., 0., 1., 0., 1.]); g = torch.tensor([7, 3, 7, 7, 3, 7])
>>> ADVANTAGES["dr_grpo"](s, g).tolist()
[0.25, 0.0, -0.75, 0.25, 0.0, 0.25]
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from mmrl.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")


class GroupStats(NamedTuple):
    """Per-row views of per-group statistics (all float64, shape [N])."""

    centered: Tensor  # r - mean_g, exactly 0 in constant groups
    count: Tensor  # n_g
    std: Tensor  # unbiased (correction=1) std of the group; 0 where n_g == 1


def _check(scores: Tensor, group_ids: Tensor) -> None:
    if scores.dim() != 1 or group_ids.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(
            f"scores and group_ids must both be 1-D of equal length; got "
            f"{tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Centre scores on their group mean and compute the unbiased group std, vectorised.

    centered_i = r_i - mean_{g(i)};  std_g = sqrt(sum_{j in g} centered_j^2 / (n_g - 1)).
    """
    _check(scores, group_ids)
    r = scores.detach().to(torch.float64)
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    counts = counts.to(r)
    sums = r.new_zeros(n_groups).index_add_(0, inv, r)
    centered = r - (sums / counts)[inv]
    # Exact zero for constant groups: mean = sum / n need not reproduce the common value bit-exactly.
    gmax = r.new_zeros(n_groups).scatter_reduce_(0, inv, r, "amax", include_self=False)
    gmin = r.new_zeros(n_groups).scatter_reduce_(0, inv, r, "amin", include_self=False)
    constant = (gmax == gmin)[inv]
    centered = torch.where(constant, torch.zeros_like(centered), centered)
    sq = r.new_zeros(n_groups).index_add_(0, inv, centered * centered)
    # clamp(n - 1, 1): a group of one has centered == 0 and sq == 0, so std is 0, not NaN.
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    return GroupStats(centered, counts[inv], std[inv])


def _out(adv: Tensor, scores: Tensor) -> Tensor:
    dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    return adv.to(dtype)


@ADVANTAGES.register("grpo")
def grpo_advantage(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps).

    std_g is the *unbiased* sample std (torch.std default, correction=1), as in TRL's
    GRPOTrainer and EasyR1's compute_grpo_outcome_advantage. Groups of one or with equal scores
    give 0.
    """
    st = group_stats(scores, group_ids)
    return _out(st.centered / (st.std + eps), scores)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantage(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_g (no std division, which biases toward easy/hard prompts).

    ``eps`` is accepted for a uniform signature and unused.
    """
    return _out(group_stats(scores, group_ids).centered, scores)


@ADVANTAGES.register("rloo")
def rloo_advantage(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """RLOO: A_i = r_i - mean_{j in g, j != i} r_j = n/(n-1) * (r_i - mean_g); n == 1 gives 0.

    Computed from the centred form so constant groups are exactly 0. ``eps`` is unused.
    """
    st = group_stats(scores, group_ids)
    scale = st.count / (st.count - 1).clamp(min=1)
    return _out(st.centered * scale, scores)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantage(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline: c_i = r_i - mean_g, then A_i = (c_i - mean(c)) / (std(c) + eps).

    The whitening uses the whole batch (all N rows), unbiased std, as verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (masked_whiten). mean(c) is 0
    up to rounding since every group is centred, but subtracting it keeps this a true whitening.
    A batch of one row gives 0.
    """
    c = group_stats(scores, group_ids).centered
    if c.numel() < 2:
        return _out(torch.zeros_like(c), scores)
    c = c - c.mean()
    return _out(c / (c.std() + eps), scores)


def compute_advantages(name: str, scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Look up ``name`` in ADVANTAGES (or a "pkg.mod:fn" path) and apply it."""
    return ADVANTAGES.get(name)(scores, group_ids, eps=eps)
