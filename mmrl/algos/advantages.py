"""Outcome advantages for group-sampled RL (GRPO family).

Every estimator has the uniform signature

    fn(scores[N], group_ids[N], *, lengths=None, eps=1e-6, **options) -> adv[N]

and sits in the plain dict ``ADVANTAGES`` under its name. ``lengths`` (valid completion tokens
per row) is used by estimators that weight rows by their token count (``reinforce_pp``); the
others ignore it. Rows are grouped by ``group_ids`` (arbitrary ints, any order, gaps allowed),
never by position, so a trainer may shuffle or filter rows freely.

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

import inspect
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from mmrl.loader import is_import_path, load  # a stdlib-only leaf: algos stays pure

AdvantageFn = Callable[..., Tensor]


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


def _scaled(centered: Tensor, std: Tensor, eps: float) -> Tensor:
    """centered / (std + eps), exactly 0 where centered is 0 (also with eps = 0)."""
    return torch.where(centered == 0, torch.zeros_like(centered), centered / (std + eps))


def grpo_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6,
                   scale: str = "group") -> Tensor:
    """GRPO: A_i = (r_i - mean_g) / (s + eps).

    ``scale`` picks s, as TRL's ``scale_rewards``: "group" (default) the *unbiased* group std
    (torch.std, as TRL's GRPOTrainer and EasyR1); "batch" the unbiased std of all N scores (one
    number for the batch); "none" no division (= dr_grpo). Groups of one or with equal scores
    give 0 in every mode.
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALE_MODES}")
    return _out(_SCALES[scale](group_stats(scores, group_ids), scores, eps), scores)


def _batch_std(scores: Tensor) -> Tensor:
    r = scores.detach().to(torch.float64)
    return r.std() if r.numel() > 1 else r.new_zeros(())


# GRPO's advantage from the group statistics, per `scale` (algo.scale_rewards)
_SCALES = {
    "group": lambda st, scores, eps: _scaled(st.centered, st.std, eps),
    "batch": lambda st, scores, eps: _scaled(st.centered, _batch_std(scores), eps),
    "none": lambda st, scores, eps: st.centered,
}
SCALE_MODES = tuple(_SCALES)
# pass@k: whether the best row's gap is divided by the group std, per `scale`
_PASSK_DIVIDES = {"group": True, "none": False}


def dr_grpo_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_g (no std division, which biases toward easy/hard prompts)."""
    return _out(group_stats(scores, group_ids).centered, scores)


def rloo_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6) -> Tensor:
    """RLOO: A_i = r_i - mean_{j in g, j != i} r_j = n/(n-1) * (r_i - mean_g); n == 1 gives 0.

    Computed from the centred form so constant groups are exactly 0.
    """
    st = group_stats(scores, group_ids)
    scale = st.count / (st.count - 1).clamp(min=1)
    return _out(st.centered * scale, scores)


def reinforce_pp_advantage(scores: Tensor, group_ids: Tensor, *, lengths: Tensor | None = None,
                           eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline: c_i = r_i - mean_g, then whitened over the batch's valid *tokens*.

    Every token of row i carries c_i, so with T = sum_i len_i:

        mu = sum_i len_i c_i / T,   var = sum_i len_i (c_i - mu)^2 / (T - 1),
        A_i = (c_i - mu) / (sqrt(var) + eps)

    This is verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (masked_whiten over
    the response mask, unbiased): long completions weigh more in the statistics. ``lengths``
    None weights every row 1 (whitening over rows). Fewer than two tokens gives 0.
    """
    c = group_stats(scores, group_ids).centered
    w = torch.ones_like(c) if lengths is None else lengths.detach().to(c)
    if w.shape != c.shape:
        raise ValueError(f"lengths must be [N={c.numel()}]; got {tuple(w.shape)}")
    total = w.sum()
    if total < 2:
        return _out(torch.zeros_like(c), scores)
    mu = (w * c).sum() / total
    var = (w * (c - mu) ** 2).sum() / (total - 1)
    return _out((c - mu) / (var.sqrt() + eps), scores)


def gpg_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6,
                  f_norm: float = 1.0) -> Tensor:
    """GPG (Chu et al. 2025): A_i = alpha (r_i - mean_g) / f_norm, alpha = N / #(r != 0).

    alpha rescales the batch gradient up for the rows that carry no reward, as verl's
    ``compute_gpg_outcome_advantage`` (which counts non-zero *scores*). Pair it with
    ``loss_type: gpg`` (no ratio, no clipping).
    """
    st = group_stats(scores, group_ids)
    nonzero = int((scores.detach() != 0).sum())
    alpha = scores.numel() / max(nonzero, 1)
    return _out(alpha * st.centered / f_norm, scores)


def passk_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6,
                    scale: str = "group") -> Tensor:
    """Pass@k training (Chen et al. 2025, verl ``grpo_passk``): in each group only the best row
    gets a non-zero advantage, A = (r_max - r_second) / (std_g + eps) (scale "none": no std).

    Ties for the best go to the first row of the group in batch order; groups of one give 0
    (verl raises on them).
    """
    if scale not in _PASSK_DIVIDES:
        raise ValueError(f"grpo_passk: scale must be 'group' or 'none'; got {scale!r}")
    st = group_stats(scores, group_ids)
    r = scores.detach().to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    adv = torch.zeros_like(r)
    for g in range(n_groups):  # groups are few (prompts per step); clarity over vectorising
        rows = (inv == g).nonzero().flatten()
        if rows.numel() < 2:
            continue
        top = torch.topk(r[rows], 2, sorted=True)
        best = rows[int((r[rows] == top.values[0]).nonzero()[0])]
        gap = top.values[0] - top.values[1]
        adv[best] = _scaled(gap, st.std[best], eps) if _PASSK_DIVIDES[scale] else gap
    return _out(adv, scores)


def reinforce_advantage(scores: Tensor, group_ids: Tensor, *, lengths=None, eps: float = 1e-6) -> Tensor:
    """Plain REINFORCE: A_i = r_i (no baseline). With rewards in {-1, +1} and
    pos_weight/neg_weight this is W-REINFORCE / PSR / NSR (Zhu et al. 2025)."""
    _check(scores, group_ids)
    return _out(scores.detach().to(torch.float64), scores)


ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantage,
    "dr_grpo": dr_grpo_advantage,
    "rloo": rloo_advantage,
    "reinforce_pp": reinforce_pp_advantage,
    "gpg": gpg_advantage,
    "grpo_passk": passk_advantage,
    "reinforce": reinforce_advantage,
}


def get_advantage(name: str) -> AdvantageFn:
    """ADVANTAGES[name], or a user function "pkg.mod:fn" with the same signature."""
    if name in ADVANTAGES:
        return ADVANTAGES[name]
    if is_import_path(name):
        return load(name, "advantage")
    raise KeyError(f"unknown advantage {name!r}; known: {', '.join(sorted(ADVANTAGES))}")


def compute_advantages(name: str, scores: Tensor, group_ids: Tensor, *, lengths: Tensor | None = None,
                       eps: float = 1e-6, **options) -> Tensor:
    """Look up ``name`` and apply it. ``options`` whose value is None are left out; an option
    the estimator does not take is an error (a knob that would silently do nothing)."""
    fn = get_advantage(name)
    options = {k: v for k, v in options.items() if v is not None}
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            raise ValueError(f"advantage {name!r} takes no option {', '.join(unknown)}")
    return fn(scores, group_ids, lengths=lengths, eps=eps, **options)


def weight_by_sign(adv: Tensor, pos_weight: float = 1.0, neg_weight: float = 1.0) -> Tensor:
    """Scale positive advantages by ``pos_weight`` and negative ones by ``neg_weight``.

    W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement")
    is pos_weight 0.1; PSR (positive samples only) is neg_weight 0; NSR is pos_weight 0.
    """
    if pos_weight < 0 or neg_weight < 0:
        raise ValueError(f"pos_weight and neg_weight must be >= 0; got {pos_weight}, {neg_weight}")
    if pos_weight == 1.0 and neg_weight == 1.0:
        return adv
    return torch.where(adv > 0, adv * pos_weight, torch.where(adv < 0, adv * neg_weight, adv))
