"""Per-token estimators of KL(pi || pi_ref) from sampled tokens (Schulman, "Approximating KL").

With x ~ pi and log-ratio  d = log pi_ref(x) - log pi(x) = ref_logp - logp:

    k1 = -d                    = logp - ref_logp          unbiased, high variance, can be < 0
    k2 = d^2 / 2               = 0.5 (logp - ref_logp)^2  biased, low variance, >= 0
    k3 = exp(d) - d - 1                                   unbiased, low variance, >= 0 (GRPO)

Gradients flow into ``logp`` only; ``ref_logp`` is a frozen reference and is detached.

>>> import math, torch
>>> lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
>>> [round(kl_penalty(lp, ref, k).item(), 6) for k in ("k1", "k2", "k3")]
[0.693147, 0.240227, 0.193147]
"""
from __future__ import annotations

import torch
from torch import Tensor

# exp(d) overflows float32 near d = 88; +-20 already means a probability ratio of ~5e8, far
# outside anything a KL penalty should see (verl clamps the same quantity).
_MAX_LOG_RATIO = 20.0


def _k1(d: Tensor, clamp: float | None) -> Tensor:
    return -d


def _k2(d: Tensor, clamp: float | None) -> Tensor:
    return 0.5 * d * d


def _k3(d: Tensor, clamp: float | None) -> Tensor:
    d = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k3 = torch.exp(d) - d - 1.0
    return k3 if clamp is None else k3.clamp(-clamp, clamp)


# estimator(d = ref_logp - logp, clamp) per `kind` (algo.kl / algo.kl_reward_kind)
KL_ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3}
KL_KINDS = tuple(KL_ESTIMATORS)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3", clamp: float | None = None) -> Tensor:
    """Elementwise KL estimate, same shape as ``logp``; see the module docstring for formulas.

    ``kind`` is "k1", "k2" or "k3" (aliases: "kl"/"k1", "mse"/"k2", "low_var_kl"/"k3").
    For k3 the log-ratio is clamped to +-20 to avoid exp overflow. ``clamp`` (k3 only) also
    clamps the k3 *value* to [-clamp, clamp], as verl's ``low_var_kl`` does with 10; None = off.
    """
    kind = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.get(kind, kind)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    estimator = KL_ESTIMATORS.get(kind)
    if estimator is None:
        raise ValueError(f"unknown kl estimator {kind!r}; expected one of {KL_KINDS}")
    return estimator(ref_logp.detach() - logp, clamp)


def kl_in_reward(scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, coef: float,
                 kind: str = "k1", clamp: float | None = None) -> tuple[Tensor, Tensor]:
    """KL as a reward penalty instead of a loss term (verl ``use_kl_in_reward``).

    Per row: r_i - coef * sum_t m_t KL_t, with KL_t = kl_penalty(logp, ref_logp, kind) of the
    policy that sampled (old) against the reference. verl puts -coef * KL_t on every token and the
    outcome estimators sum the token rewards, which is this sum. ``clamp`` bounds each token's k3
    value as in the loss (algo.kl_clamp; verl clamps low_var_kl at 10 in both). Returns (new
    scores [N], the batch KL = mean over rows of the per-row token-mean KL [scalar], which the
    adaptive controller tracks, as verl's ``current_kl``).
    """
    m = mask.to(torch.float64)
    valid = m > 0
    zero = torch.zeros_like(logp, dtype=torch.float64)
    kl = kl_penalty(torch.where(valid, logp.detach().double(), zero),
                    torch.where(valid, ref_logp.detach().double(), zero), kind, clamp)
    per_row = (kl * m).sum(-1)
    seq_mean = per_row / m.sum(-1).clamp(min=1)
    current = seq_mean.mean() if seq_mean.numel() else seq_mean.new_zeros(())
    return (scores.double() - coef * per_row).to(scores.dtype if scores.is_floating_point()
                                                 else torch.float32), current


class KLController:
    """The KL-in-reward coefficient: fixed (``target`` None) or adaptive (Ziegler et al. 2019).

    Adaptive update, as verl's ``AdaptiveKLController``:
        e = clip(current_kl / target - 1, -0.2, 0.2);  coef *= 1 + e * n_samples / horizon
    ``state_dict`` / ``load_state_dict`` carry ``coef`` through checkpoints.
    """

    def __init__(self, coef: float, target: float | None = None, horizon: float = 10000.0):
        if target is not None and (target <= 0 or horizon <= 0):
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0; got {target}, {horizon}")
        self.coef, self.target, self.horizon = float(coef), target, float(horizon)

    def update(self, current_kl: float, n_samples: int) -> float:
        if self.target is not None:
            err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
            self.coef *= 1.0 + err * n_samples / self.horizon
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
