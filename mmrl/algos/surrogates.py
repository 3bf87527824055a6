"""Per-token policy-gradient surrogates [N, L] behind ``policy_loss`` (its settings' ``loss_type``).
Pure torch.

With r_t the importance ratio, A the advantage, sg the stop-gradient:

* "ppo"      max(-A r, -A clip(r, 1-lo, 1+hi)); with ``dual_clip`` c (Ye et al. 2020, verl
             ``clip_ratio_c``, EasyR1) tokens with A < 0 are further capped at -A c, so one huge
             ratio on a bad token cannot dominate: ratio 4, A = -1, c = 3 gives 3, not 4.
* "cispo"    -A sg(clip(r, 1-lo, 1+hi)) log pi  (MiniMax-M1): every token keeps a gradient,
             the IS weight is what is clipped. Value form as verl/skyrl (it includes log pi).
* "gpg"      -A log pi  (GPG, Chu et al. 2025; verl ``policy_loss: gpg``): no ratio, no clip.
* "clip_cov" PPO, then the gradient of a random ``cov_ratio`` share of tokens whose centred
             covariance (A - mean A)(log pi - mean log pi) lies in (cov_lb, cov_ub) and that
             PPO did not already clip is removed (Cui et al. 2025, "The Entropy Mechanism of RL
             for Reasoning LMs"; verl ``clip_cov``).
* "kl_cov"   -A r on every token, plus kl_cov_coef |log pi - log pi_old| on the top ``cov_ratio``
             share of tokens by that covariance (same paper; verl ``kl_cov``). No clipping.

Clip-Cov and KL-Cov select tokens *within the call* (means, counts and the top-k are over the
tokens passed in), as verl does per micro-batch: they are not micro-batch invariant.
"""
from __future__ import annotations

import torch
from torch import Tensor

LOSS_TYPES = ("ppo", "cispo", "gpg", "clip_cov", "kl_cov")


def ppo_surrogate(r: Tensor, a: Tensor, clip_low: float, clip_high: float,
                  dual_clip: float | None = None) -> Tensor:
    per_token = torch.maximum(-a * r, -a * r.clamp(1.0 - clip_low, 1.0 + clip_high))
    if dual_clip is not None:
        per_token = torch.where(a < 0, torch.minimum(per_token, -a * dual_clip), per_token)
    return per_token


def cispo_surrogate(r: Tensor, logp: Tensor, a: Tensor, clip_low: float, clip_high: float) -> Tensor:
    return -a * r.detach().clamp(1.0 - clip_low, 1.0 + clip_high) * logp


def _covariance(a: Tensor, logp: Tensor, valid: Tensor) -> Tensor:
    """(A - mean A)(log pi - mean log pi) per token, means over valid tokens; detached."""
    a, lp = a.detach().expand_as(logp), logp.detach()
    n = valid.sum().clamp(min=1)
    mean_a = torch.where(valid, a, 0).sum() / n
    mean_lp = torch.where(valid, lp, 0).sum() / n
    return (a - mean_a) * (lp - mean_lp)


def clip_cov_surrogate(r: Tensor, logp: Tensor, a: Tensor, valid: Tensor, clip_low: float,
                       clip_high: float, *, cov_ratio: float, cov_lb: float, cov_ub: float,
                       generator: torch.Generator | None = None) -> Tensor:
    unclipped = -a * r
    clipped = -a * r.clamp(1.0 - clip_low, 1.0 + clip_high)
    with torch.no_grad():
        cov = _covariance(a, logp, valid)
        eligible = valid & ~(clipped > unclipped) & (cov > cov_lb) & (cov < cov_ub)
        candidates = eligible.flatten().nonzero().flatten()
        n_pick = max(int(cov_ratio * int(valid.sum())), 1)
        order = torch.randperm(candidates.numel(), generator=generator, device="cpu")
        picked = candidates[order[:n_pick].to(candidates.device)]
        keep = torch.ones(valid.numel(), dtype=r.dtype, device=r.device)
        keep[picked] = 0.0
    return torch.maximum(unclipped, clipped) * keep.view_as(r)


def kl_cov_surrogate(r: Tensor, logp: Tensor, old_logp: Tensor, a: Tensor, valid: Tensor, *,
                     cov_ratio: float, kl_cov_coef: float) -> Tensor:
    per_token = -a * r
    with torch.no_grad():
        cov = _covariance(a, logp, valid).flatten()
        idx = valid.flatten().nonzero().flatten()
        n_pick = max(int(idx.numel() * cov_ratio), 1) if idx.numel() else 0
        top = idx[torch.topk(cov[idx], n_pick).indices] if n_pick else idx
        chosen = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        chosen[top] = True
    penalty = kl_cov_coef * (logp - old_logp).abs()
    return torch.where(chosen.view_as(r), per_token + penalty, per_token)
