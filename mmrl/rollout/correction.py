"""Off-policy correction for a rollout engine whose sampler differs from the trained policy.

A separate engine (vLLM) samples from its own copy of the weights, with its own kernels: its
per-token probabilities `sampler_logp` differ from the trainer's `old_logp` (numerics, a
stale copy, bf16 vs fp32). Truncated importance sampling (TIS, Yao et al. 2025, "Your efficient
RL framework secretly brings you off-policy RL training") reweights each token's loss by
min(pi_old / pi_sampler, cap), which keeps the gradient estimate unbiased up to the cap.
Pure torch: no model, no config.
"""
from __future__ import annotations

import torch


def tis_weights(trainer_old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                cap: float = 2.0) -> torch.Tensor:
    """Token-level truncated importance weights [N, L] = min(exp(old - sampler), cap), detached,
    0 where `mask` is 0. Multiply them into the per-token policy loss.

    >>> old = torch.tensor([[-1.0, -2.0, 0.0]])
    >>> smp = torch.tensor([[-1.0, -3.0, -0.5]])
    >>> tis_weights(old, smp, torch.tensor([[1, 1, 0]]), cap=2.0)
    tensor([[1., 2., 0.]])
    """
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    if trainer_old_logp.shape != sampler_logp.shape or sampler_logp.shape != mask.shape:
        raise ValueError(f"tis_weights: shapes differ: old {tuple(trainer_old_logp.shape)}, "
                         f"sampler {tuple(sampler_logp.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    # Masked positions may hold anything (-inf, garbage): zero the log-ratio there first, so
    # neither exp() overflow nor NaN can leak through the multiplication by the mask.
    log_ratio = torch.where(m, trainer_old_logp.detach().float() - sampler_logp.detach().float(),
                            torch.zeros((), dtype=torch.float32, device=mask.device))
    weights = torch.exp(log_ratio).clamp(max=cap)
    return torch.where(m, weights, torch.zeros_like(weights))


def tis_metrics(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """Mean weight and the fraction of tokens at the cap (how off-policy the sampler is)."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    return {"tis/mean_weight": float(weights[m].sum() / n),
            "tis/clipped_frac": float(((weights >= cap) & m).sum() / n)}
