"""The decoupled PPO objective (mmrl/algos/decoupled.py) equals AReaL's `ppo_actor_loss_fn` to
1e-9 in float64, value and gradient, for each IS knob it maps to.

The reference is a transcription of areal 1.0.4 (Apache-2.0), areal/utils/functional/
functional.py: `ppo_actor_loss_fn` and `apply_rejection_sampling` (2D padded inputs, metric
"ratio"), kept line for line. The package itself cannot be a test dependency: 1.0.4 requires
torch<2.11 (this project runs torch 2.13) and ~80 packages (ray, litellm, openhands, vLLM-side
servers), and its module imports its config and data packages at import time.
"""
from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import LossSettings, behaviour_weights, decoupled_loss


# ---- areal 1.0.4, transcribed (names and steps as there) -----------------------------------
def _areal_rejection(proximal_logprobs, old_logprobs, loss_mask, level, action, agg, upper,
                     lower):
    log_ratio = proximal_logprobs.detach().float() - old_logprobs.detach().float()
    log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)
    metric = torch.exp(log_ratio)
    behave_imp_weight = torch.exp(log_ratio)

    def check(m):
        return (m >= lower) & (m <= upper) if lower is not None else m <= upper

    if level == "sequence":
        agg_values = log_ratio
        masked_agg = torch.where(loss_mask.bool(), agg_values, 0.0)
        valid_count = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)
        seq_log_mean = masked_agg.sum(dim=-1, keepdim=True) / valid_count
        behave_imp_weight = torch.exp(seq_log_mean).expand_as(log_ratio)
        seq_agg = (masked_agg.sum(dim=-1, keepdim=True) if agg == "sum"
                   else masked_agg.sum(dim=-1, keepdim=True) / valid_count)
        seq_metric = torch.exp(seq_agg)
        if action == "mask":
            in_bounds = check(seq_metric).expand_as(loss_mask)
        else:
            out_of_bounds = (~check(seq_metric)).expand_as(loss_mask)
            behave_imp_weight = torch.where(out_of_bounds, behave_imp_weight.clamp(
                min=lower if lower is not None else 0.0, max=upper), behave_imp_weight)
    elif action == "mask":
        in_bounds = check(metric)
    else:
        behave_imp_weight = behave_imp_weight.clamp(min=lower if lower is not None else 0.0,
                                                    max=upper)
    updated_mask = (loss_mask.bool() & in_bounds).to(loss_mask.dtype) if action == "mask" \
        else loss_mask
    behave_imp_weight = torch.where(updated_mask.bool(), behave_imp_weight, 0.0)
    return updated_mask, behave_imp_weight


def _areal_ppo_actor_loss_fn(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip,
                             loss_mask, eps_clip_higher=None, c_clip=None, rejection=None):
    loss_mask_count = loss_mask.count_nonzero() or 1
    if rejection is not None:
        loss_mask, behave_imp_weight = _areal_rejection(proximal_logprobs, old_logprobs,
                                                        loss_mask, **rejection)
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip,
                                1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher))
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    if c_clip is not None:
        pg_loss3 = torch.sign(advantages) * c_clip * advantages
        pg_loss = torch.min(pg_loss, pg_loss3)
    if rejection is not None:
        pg_loss = pg_loss * behave_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count


# ---- the cases ------------------------------------------------------------------------------
def _inputs(seed: int = 0, n: int = 6, length: int = 9):
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(n, length, generator=g, dtype=torch.float64) * 3
    behav = prox + torch.randn(n, length, generator=g, dtype=torch.float64) * 0.6  # stale
    logp = (prox + torch.randn(n, length, generator=g, dtype=torch.float64) * 0.3)
    adv = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, length).contiguous()
    mask = torch.rand(n, length, generator=g) > 0.25
    mask[:, 0] = True
    return logp.requires_grad_(), prox, behav, adv, mask


# (our tis_cap, tis_level, tis_mode) -> AReaL's rejection_sampling. tis_level "sequence" (the
# product of the token ratios, verl's) has no AReaL counterpart: AReaL's sequence level always
# weights by the geometric mean (its agg "sum" changes only the filter), which is our "geometric".
CASES = [
    ((2.0, "token", "truncate"), dict(level="token", action="clamp", agg="mean", upper=2.0,
                                      lower=None)),
    ((1.5, "token", "mask"), dict(level="token", action="mask", agg="mean", upper=1.5,
                                  lower=1 / 1.5)),
    ((1.3, "geometric", "truncate"), dict(level="sequence", action="clamp", agg="mean",
                                          upper=1.3, lower=None)),
    ((1.3, "geometric", "mask"), dict(level="sequence", action="mask", agg="mean", upper=1.3,
                                      lower=1 / 1.3)),
    ((None, "token", "truncate"), dict(level="token", action="clamp", agg="mean",
                                       upper=math.inf, lower=None)),  # uncapped, as in the paper
]


@pytest.mark.parametrize("knobs,rejection", CASES)
@pytest.mark.parametrize("clip_high,dual", [(0.2, None), (0.28, 3.0)])
def test_decoupled_loss_equals_areal(knobs, rejection, clip_high, dual):
    cap, level, mode = knobs
    logp, prox, behav, adv, mask = _inputs()
    settings = LossSettings(clip_low=0.2, clip_high=clip_high, agg="token_mean", dual_clip=dual)
    ours, _ = decoupled_loss(logp, prox, behav, adv, mask, settings, cap=cap, level=level,
                             mode=mode)
    (g_ours,) = torch.autograd.grad(ours, logp)
    ref = _areal_ppo_actor_loss_fn(logp, prox, behav, adv, 0.2, mask, eps_clip_higher=clip_high,
                                   c_clip=dual, rejection=rejection)
    (g_ref,) = torch.autograd.grad(ref, logp)
    assert ours.dtype == torch.float64
    assert abs(float(ours) - float(ref)) <= 1e-9
    assert torch.allclose(g_ours, g_ref, rtol=0, atol=1e-9)
    assert float(ours) != 0.0


def test_behaviour_weight_is_the_sampler_ratio_by_hand():
    prox = torch.tensor([[-1.0, -2.0, -0.5]])
    behav = torch.tensor([[-1.5, -1.0, -0.5]])
    w = behaviour_weights(prox, behav, torch.tensor([[1, 1, 0]]), cap=None)
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-1.0), 0.0]]))
    assert float(behaviour_weights(prox, behav, torch.ones(1, 3), cap=1.2)[0, 0]) == \
        pytest.approx(1.2)
