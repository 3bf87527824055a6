"""Off-policy correction for a rollout engine whose sampler differs from the trained policy.

A separate engine (vLLM) samples from its own copy of the weights, with its own kernels: its
per-token probabilities ``sampler_logp`` differ from the trainer's ``old_logp`` (numerics, a
stale copy, bf16 vs fp32). Truncated importance sampling (TIS, Yao et al. 2025, "Your efficient
RL framework secretly brings you off-policy RL training") reweights each token's loss by
min(pi_old / pi_sampler, cap), which keeps the gradient estimate unbiased up to the cap.

``is_weights`` adds verl's rollout-correction variants (``rollout_is`` level x mode):

* level "token":     w_t = pi_old(x_t) / pi_sampler(x_t)
* level "sequence":  w_i = prod_t w_t = exp(sum_t log w_t), the same on every token of row i
* level "geometric": w_i = exp(mean_t log w_t) (length-normalised sequence ratio)
* mode "truncate":   min(w, cap)                     (TIS; cap = upper threshold)
* mode "mask":       w if lower <= w <= cap else 0   (rejection: drop outliers; the kept
                     tokens keep their ratio, as verl's ``rollout_is_mode: mask``)

Pure torch: no model, no config.
"""
from __future__ import annotations

import torch

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: far past any cap, far below float32 overflow


def _log_ratio(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    m = mask.bool()
    # Masked positions may hold anything (-inf, garbage): zero the log-ratio there first, so
    # neither exp() overflow nor NaN can leak through the multiplication by the mask.
    lr = torch.where(m, old.detach().float() - sampler.detach().float(),
                     torch.zeros((), dtype=torch.float32, device=mask.device))
    return _LEVELS[level](lr, m)


def _per_token(lr: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return lr


def _per_sequence(lr: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return lr.sum(-1, keepdim=True).expand_as(lr)


def _per_sequence_mean(lr: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (lr.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).expand_as(lr)


def _truncate(w: torch.Tensor, cap: float, lower: float | None) -> torch.Tensor:
    return w.clamp(max=cap)


def _mask_outside(w: torch.Tensor, cap: float, lower: float | None) -> torch.Tensor:
    low = 1.0 / cap if lower is None else lower
    return torch.where((w >= low) & (w <= cap), w, torch.zeros_like(w))


# log-ratio per token from the token log-ratios and the mask, per `level` (algo.tis_level)
_LEVELS = {"token": _per_token, "sequence": _per_sequence, "geometric": _per_sequence_mean}
# weights from the raw ratios, per `mode` (algo.tis_mode)
_MODES = {"truncate": _truncate, "mask": _mask_outside}
IS_LEVELS = tuple(_LEVELS)
IS_MODES = tuple(_MODES)


def is_weights(trainer_old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
               cap: float = 2.0, *, level: str = "token", mode: str = "truncate",
               lower: float | None = None) -> torch.Tensor:
    """Importance weights [N, L] (detached, 0 where ``mask`` is 0); see the module docstring.

    ``lower`` (mode "mask" only) defaults to 1 / cap, as verl's ``rollout_is_threshold_lower``.

    >>> old = torch.tensor([[-1.0, -2.0, 0.0]]); smp = torch.tensor([[-1.5, -2.5, 0.0]])
    >>> is_weights(old, smp, torch.tensor([[1, 1, 0]]), cap=2.0, level="sequence")  # e^1 > 2
    tensor([[2., 2., 0.]])
    """
    if cap <= 0:
        raise ValueError(f"importance-sampling cap must be > 0, got {cap}")
    if level not in IS_LEVELS or mode not in IS_MODES:
        raise ValueError(f"is level/mode must be in {IS_LEVELS} / {IS_MODES}; got {level!r}, {mode!r}")
    if trainer_old_logp.shape != sampler_logp.shape or sampler_logp.shape != mask.shape:
        raise ValueError(f"is_weights: shapes differ: old {tuple(trainer_old_logp.shape)}, "
                         f"sampler {tuple(sampler_logp.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()
    w = _log_ratio(trainer_old_logp, sampler_logp, mask, level).clamp(max=_MAX_LOG_RATIO).exp()
    w = _MODES[mode](w, cap, lower)
    return torch.where(m, w, torch.zeros_like(w))


def tis_weights(trainer_old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                cap: float = 2.0) -> torch.Tensor:
    """Token-level truncated importance weights [N, L] = min(exp(old - sampler), cap), detached,
    0 where `mask` is 0. Multiply them into the per-token policy loss.

    >>> old = torch.tensor([[-1.0, -2.0, 0.0]])
    >>> smp = torch.tensor([[-1.0, -3.0, -0.5]])
    >>> tis_weights(old, smp, torch.tensor([[1, 1, 0]]), cap=2.0)
    tensor([[1., 2., 0.]])
    """
    return is_weights(trainer_old_logp, sampler_logp, mask, cap, level="token", mode="truncate")


def tis_metrics(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """Mean weight and the fraction of tokens at the cap (how off-policy the sampler is)."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    return {"tis/mean_weight": float(weights[m].sum() / n),
            "tis/clipped_frac": float(((weights >= cap) & m).sum() / n)}
