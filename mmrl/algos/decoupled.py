"""The decoupled PPO objective for samples drawn by an older copy of the weights (AReaL, Fu et al.
2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning").

Three policies: pi_theta (being trained), pi_prox (the trainer's weights before this update: the
proximal policy, our ``old_logp``) and pi_behav (the sampler's weights when it drew the sample,
``sampler_logp``). Per token:

    l_t = w_t * max(-A r_t, -A clip(r_t, 1 - lo, 1 + hi)),
    r_t = pi_theta / pi_prox   (the trust region is around the proximal policy, not the stale one)
    w_t = pi_prox / pi_behav   (behaviour importance weight, detached)

``w`` is `correction.is_weights` with the run's IS knobs (algo.tis_cap / tis_level / tis_mode):
truncate = AReaL's rejection_sampling action "clamp", mask = action "mask" (lower bound 1 / cap,
as `is_weights`), level geometric = AReaL's level "sequence" with agg "mean" (level "sequence",
the product of the token ratios, is verl's and has no AReaL counterpart). Without a cap the
weight is uncapped (the paper's objective as written). tests/algos/test_decoupled.py holds this
to AReaL 1.0.4's `ppo_actor_loss_fn` at 1e-9 in float64. The surrogate and its aggregation are
`losses.policy_loss`'s, so every loss knob applies unchanged. Pure torch.
"""
from __future__ import annotations

import math

import torch

from mmrl.algos.correction import is_weights
from mmrl.algos.losses import LossInputs, LossSettings, policy_loss


def behaviour_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                      mask: torch.Tensor, cap: float | None = None, *, level: str = "token",
                      mode: str = "truncate") -> torch.Tensor:
    """w = pi_prox / pi_behav per token [N, L] (detached, 0 where ``mask`` is 0); ``cap`` None:
    uncapped. The same function the synchronous loop uses for algo.tis_cap."""
    return is_weights(proximal_logp, behaviour_logp, mask, math.inf if cap is None else cap,
                      level=level, mode=mode)


def decoupled_loss(logp: torch.Tensor, proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                   adv: torch.Tensor, mask: torch.Tensor, settings: LossSettings | None = None, *,
                   cap: float | None = None, level: str = "token", mode: str = "truncate",
                   normalizer=None) -> tuple[torch.Tensor, dict]:
    """The decoupled objective as one call (module docstring) -> (loss, metrics); what the
    Learner computes per micro-batch when rollout.max_staleness >= 1."""
    weights = behaviour_weights(proximal_logp, behaviour_logp, mask, cap, level=level, mode=mode)
    return policy_loss(LossInputs(logp, proximal_logp, adv, mask, token_weights=weights),
                       settings, normalizer=normalizer)
