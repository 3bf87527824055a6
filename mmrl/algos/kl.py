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

KL_KINDS = ("k1", "k2", "k3")

# exp(d) overflows float32 near d = 88; +-20 already means a probability ratio of ~5e8, far
# outside anything a KL penalty should see (verl clamps the same quantity).
_MAX_LOG_RATIO = 20.0


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Elementwise KL estimate, same shape as ``logp``; see the module docstring for formulas.

    ``kind`` is "k1", "k2" or "k3" (aliases: "kl"/"k1", "mse"/"k2", "low_var_kl"/"k3").
    For k3 the log-ratio is clamped to +-20 to avoid exp overflow.
    """
    kind = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.get(kind, kind)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    d = ref_logp.detach() - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        d = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown kl estimator {kind!r}; expected one of {KL_KINDS}")
