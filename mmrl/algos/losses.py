"""Clipped policy-gradient loss (PPO / GRPO / DAPO / Dr.GRPO / GSPO), pure over tensors.

Shapes: ``logp, old_logp, ref_logp, mask: [N, L]`` (completion tokens), ``adv: [N]`` (or
``[N, L]`` for per-token advantages). ``mask`` may be bool or float (float values act as
per-token weights; a token is *valid* where mask > 0).

Per-token loss (DAPO "clip-higher" when clip_high > clip_low):

    l_t = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high)) + beta * KL_t

Importance ratio ``r_t``:

* ``ratio="token"`` (PPO/GRPO):  r_t = exp(logp_t - old_logp_t)
* ``ratio="sequence"`` (GSPO):   s_i = exp(mean_{t valid}(logp_t - old_logp_t)), implemented as
  GSPO-token  r_t = sg[s_i] * exp(logp_t - sg[logp_t])  so the value is s_i on every token and
  the gradient of any aggregation that weights a sequence's tokens uniformly equals the gradient
  of the per-sequence objective (checked against autograd of the direct formula in the tests).

Aggregation (``agg``), with m the mask and ``normalizer`` replacing the batch-local denominator:

* "token_mean"              (DAPO):    sum_{i,t} m l / (normalizer or sum m)
* "seq_mean_token_mean"     (GRPO):    sum_i [sum_t m l / sum_t m] / (normalizer or N)
* "seq_mean_token_sum_norm" (Dr.GRPO): sum_i [sum_t m l / max_len] / (normalizer or N)

The knobs (clip range, agg, ratio, KL, extras) are one frozen ``LossSettings``, checked when
built; one micro-batch's tensors are one ``LossInputs``.

Micro-batching: every mode is a plain sum over rows divided by one number, so a trainer that
splits N rows into micro-batches and passes ``normalizer`` = the *global* token count
(token_mean) or the global N (seq modes) gets sum(micro losses) == one-shot loss, and the same
gradients. Metrics are computed over the micro-batch only.

Extras (all off by default): ``loss_type`` picks the surrogate (mmrl.algos.surrogates: ppo,
cispo, gpg, clip_cov, kl_cov); ``dual_clip`` c caps the loss of A < 0 tokens at -A c;
``entropy_coef`` subtracts coef * H_t per token (entropy bonus, aggregated with the same ``agg``
and normaliser as the surrogate, as verl's ``entropy_coeff``); ``kl_clamp`` clamps k3.

Log-ratios are clamped to +-20 before exp (float32 overflows near 88; verl clamps likewise).
Inputs below float32 are upcast to float32. ``old_logp``, ``ref_logp`` and ``adv`` are detached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from mmrl.algos.kl import KL_KINDS, kl_penalty
from mmrl.algos.surrogates import (LOSS_TYPES, cispo_surrogate, clip_cov_surrogate, kl_cov_surrogate,
                                   ppo_surrogate)

_MAX_LOG_RATIO = 20.0


def _safe_div(num: Tensor, denom) -> Tensor:
    """num / denom, with denom <= 0 treated as 1 (an all-masked batch has num == 0 -> loss 0)."""
    d = torch.as_tensor(denom, dtype=num.dtype, device=num.device)
    return num / torch.where(d > 0, d, torch.ones_like(d))


def loss_normalizer(mask: Tensor, agg: str) -> Tensor:
    """This process's share of the loss denominator: valid tokens (token_mean) or rows (seq_*).

    A trainer sums it over processes and passes the total as ``normalizer`` to every
    micro-batch's ``policy_loss``, so the summed micro-batch losses equal the one-shot loss.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")
    return _AGGREGATIONS[agg].normalizer(mask)


@dataclass(frozen=True)
class LossSettings:
    """The policy loss's knobs, fixed for a run: the Learner builds this once from the config
    (algo.* and rollout.max_new_tokens). Checked when built, so a bad value fails at start.
    Defaults: PPO/GRPO token-level clipping at 0.2, token_mean, no KL, no extras."""
    clip_low: float = 0.2
    clip_high: float = 0.2  # > clip_low: DAPO's clip-higher
    agg: str = "token_mean"  # AGG_MODES (module docstring)
    ratio: str = "token"  # RATIO_LEVELS: "token" (PPO/GRPO) or "sequence" (GSPO)
    beta: float = 0.0  # KL loss coefficient; 0: no KL term, ref_logp not needed
    kl: str = "k3"  # KL_KINDS (mmrl.algos.kl)
    max_len: int | None = None  # the generation budget; seq_mean_token_sum_norm divides by it
    loss_type: str = "ppo"  # LOSS_TYPES (mmrl.algos.surrogates)
    dual_clip: float | None = None  # ppo only: A < 0 tokens capped at -A c (c > 1)
    entropy_coef: float = 0.0  # entropy bonus: - coef * H_t per token (needs `entropy`)
    kl_clamp: float | None = None  # clamp of the k3 estimate
    cov_ratio: float = 2e-4  # clip_cov / kl_cov: share of tokens selected by covariance
    cov_lb: float = 1.0  # clip_cov: covariance window (cov_lb, cov_ub)
    cov_ub: float = 5.0
    kl_cov_coef: float = 1.0  # kl_cov: coefficient of |log pi - log pi_old|

    def __post_init__(self):
        for name, value, known in (("agg", self.agg, AGG_MODES),
                                   ("ratio", self.ratio, RATIO_LEVELS),
                                   ("loss_type", self.loss_type, LOSS_TYPES)):
            if value not in known:
                raise ValueError(f"unknown {name} {value!r}; expected one of {known}")
        if self.beta != 0.0 and self.kl not in KL_KINDS:
            raise ValueError(f"unknown kl {self.kl!r}; expected one of {KL_KINDS}")
        if _AGGREGATIONS[self.agg].needs_max_len and (self.max_len is None or self.max_len <= 0):
            raise ValueError("agg='seq_mean_token_sum_norm' needs max_len (the generation budget) "
                             "> 0")
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"clip_low must be in [0, 1]; got {self.clip_low}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (verl's clip_ratio_c; 3 is usual); got "
                             f"{self.dual_clip}")
        if self.dual_clip is not None and not _SURROGATES[self.loss_type].takes_dual_clip:
            raise ValueError(f"dual_clip applies to loss_type 'ppo' only; got {self.loss_type!r}")


class LossInputs(NamedTuple):
    """One micro-batch's tensors: ``logp, old_logp, ref_logp, entropy, token_weights, mask``
    [N, L], ``adv`` [N] or [N, L]. ``entropy`` carries its graph (needed when entropy_coef != 0);
    ``token_weights`` (detached) multiply the surrogate per token, e.g. truncated importance
    weights correcting a rollout engine's mismatch."""
    logp: Tensor
    old_logp: Tensor
    adv: Tensor
    mask: Tensor
    ref_logp: Tensor | None = None  # needed when beta != 0
    entropy: Tensor | None = None
    token_weights: Tensor | None = None


def _validate(x: LossInputs, s: LossSettings) -> None:
    logp = x.logp
    if logp.dim() != 2:
        raise ValueError(f"logp must be [N, L]; got {tuple(logp.shape)}")
    for name, t in (("old_logp", x.old_logp), ("mask", x.mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} {tuple(t.shape)} must match logp {tuple(logp.shape)}")
    if x.adv.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"adv must be [N] or [N, L]; got {tuple(x.adv.shape)} for logp "
                         f"{tuple(logp.shape)}")
    if s.beta != 0.0:
        if x.ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        if x.ref_logp.shape != logp.shape:
            raise ValueError(f"ref_logp {tuple(x.ref_logp.shape)} must match logp "
                             f"{tuple(logp.shape)}")
    if s.entropy_coef != 0.0 and (x.entropy is None or x.entropy.shape != logp.shape):
        raise ValueError(f"entropy_coef != 0 needs entropy of shape {tuple(logp.shape)}")


def importance_ratio(logp: Tensor, old_logp: Tensor, valid: Tensor, level: str = "token") -> Tensor:
    """Per-token ratio [N, L]; 1.0 on invalid tokens. See the module docstring for both levels.

    Invalid positions are replaced *before* any arithmetic that could overflow, so padding that
    holds -inf/NaN log-probs can neither poison the forward value nor the gradient.
    """
    if level not in _RATIOS:
        raise ValueError(f"unknown ratio {level!r}; expected one of {RATIO_LEVELS}")
    return _RATIOS[level](logp, torch.where(valid, logp - old_logp, torch.zeros_like(logp)), valid)


def _token_ratio(logp: Tensor, log_ratio: Tensor, valid: Tensor) -> Tensor:
    return log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()


def _sequence_ratio(logp: Tensor, log_ratio: Tensor, valid: Tensor) -> Tensor:
    zero = torch.zeros_like(logp)
    m = valid.to(logp.dtype)
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # length-normalised (GSPO)
    seq_log_ratio = seq_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    # value: exactly s_i (logp - sg[logp] == 0); gradient: s_i * d logp_t (GSPO-token).
    token_delta = torch.where(valid, logp - logp.detach(), zero)
    return (seq_log_ratio.detach().unsqueeze(-1) + token_delta).exp()


# the per-token ratio per `level` (algo.ratio): PPO/GRPO per token, GSPO per sequence
_RATIOS = {"token": _token_ratio, "sequence": _sequence_ratio}
RATIO_LEVELS = tuple(_RATIOS)


def aggregate_loss(per_token: Tensor, mask: Tensor, agg: str, *, max_len=None, normalizer=None) -> Tensor:
    """Reduce a per-token loss [N, L] to a scalar; formulas in the module docstring.

    ``mask`` is float (weights); ``per_token`` must already be finite where mask == 0.
    """
    if agg not in _AGGREGATIONS:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")
    return _AGGREGATIONS[agg].reduce(per_token * mask, mask, max_len, normalizer)


class _Aggregation(NamedTuple):
    reduce: Callable[..., Tensor]  # (weighted per-token loss, mask, max_len, normalizer) -> scalar
    normalizer: Callable[[Tensor], Tensor]  # this process's share of the denominator
    needs_max_len: bool = False


def _token_mean(weighted: Tensor, mask: Tensor, max_len, normalizer) -> Tensor:
    return _safe_div(weighted.sum(), mask.sum() if normalizer is None else normalizer)


def _seq_mean(per_seq: Tensor, normalizer) -> Tensor:
    return _safe_div(per_seq.sum(), per_seq.shape[0] if normalizer is None else normalizer)


def _seq_mean_token_mean(weighted: Tensor, mask: Tensor, max_len, normalizer) -> Tensor:
    # all-masked row -> 0, not NaN
    return _seq_mean(_safe_div(weighted.sum(-1), mask.sum(-1)), normalizer)


def _seq_mean_token_sum_norm(weighted: Tensor, mask: Tensor, max_len, normalizer) -> Tensor:
    if max_len is None:
        raise ValueError("agg='seq_mean_token_sum_norm' needs max_len")
    return _seq_mean(weighted.sum(-1) / float(max_len), normalizer)


def _valid_tokens(mask: Tensor) -> Tensor:
    return (mask > 0).to(torch.float64).sum() if mask.dtype == torch.bool else mask.double().sum()


def _rows(mask: Tensor) -> Tensor:
    return torch.tensor(float(mask.shape[0]), dtype=torch.float64)


# each `agg` (algo.agg): its reduction, its denominator, whether it needs the generation budget
_AGGREGATIONS = {
    "token_mean": _Aggregation(_token_mean, _valid_tokens),
    "seq_mean_token_mean": _Aggregation(_seq_mean_token_mean, _rows),
    "seq_mean_token_sum_norm": _Aggregation(_seq_mean_token_sum_norm, _rows, needs_max_len=True),
}
AGG_MODES = tuple(_AGGREGATIONS)


@torch.no_grad()
def _metrics(r: Tensor, a: Tensor, valid: Tensor, clip_low: float, clip_high: float, kl_tok) -> dict:
    """Micro-batch metrics over valid tokens, as Python floats (one device sync for all)."""
    r, a = r.detach(), a.detach().expand_as(r)
    n = valid.sum().clamp(min=1).to(r.dtype)
    low = (valid & (r < 1.0 - clip_low) & (a < 0)).sum() / n
    high = (valid & (r > 1.0 + clip_high) & (a > 0)).sum() / n
    has_any = valid.any()
    one = torch.ones((), dtype=r.dtype, device=r.device)
    # No valid token: report the neutral ratio 1.0 rather than NaN/inf.
    r_mean = torch.where(has_any, torch.where(valid, r, 0).sum() / n, one)
    r_min = torch.where(has_any, torch.where(valid, r, torch.inf).min(), one)
    r_max = torch.where(has_any, torch.where(valid, r, -torch.inf).max(), one)
    names = ["clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max"]
    values = [low, high, r_mean, r_min, r_max]
    if kl_tok is not None:
        names.append("kl")
        values.append(torch.where(valid, kl_tok.detach(), 0).sum() / n)
    return dict(zip(names, torch.stack([v.to(r.dtype) for v in values]).tolist()))


def policy_loss(x: LossInputs, settings: LossSettings | None = None, *,
                normalizer: float | Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss + optional per-token KL penalty; returns (loss, metrics).

    l_t = max(-A r_t, -A clip(r_t, 1-clip_low, 1+clip_high)) + beta * KL_t, aggregated by
    ``settings.agg`` (module docstring); ``normalizer`` replaces the batch-local denominator (the
    global one, when micro-batching). With beta == 0 the KL is not computed and ``ref_logp`` may
    be None. ``generator`` draws clip_cov's random token selection.

    metrics (Python floats, over this call's valid tokens only): clip_frac_low (r < 1-clip_low
    and A < 0), clip_frac_high (r > 1+clip_high and A > 0), ratio_mean/min/max, and kl (mean
    KL_t) when beta != 0.
    """
    s = settings or LossSettings()
    _validate(x, s)
    logp = x.logp
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    old_logp = x.old_logp.detach().to(dtype)
    valid = x.mask > 0 if x.mask.dtype != torch.bool else x.mask
    m = x.mask.to(dtype)
    a = x.adv.detach().to(dtype)
    a = a.unsqueeze(-1) if a.dim() == 1 else a

    r = importance_ratio(logp, old_logp, valid, s.ratio)
    per_token = _SURROGATES[s.loss_type].fn(
        r, torch.where(valid, logp, torch.zeros_like(logp)), old_logp, a, valid, s, generator)
    if x.token_weights is not None:
        per_token = per_token * x.token_weights.detach().to(dtype)

    kl_tok = None
    if s.beta != 0.0:
        zero = torch.zeros_like(logp)
        # Masked positions get logp == ref == 0 -> KL 0, so padding cannot overflow exp().
        ref = torch.where(valid, x.ref_logp.detach().to(dtype), zero)
        kl_tok = kl_penalty(torch.where(valid, logp, zero), ref, s.kl, clamp=s.kl_clamp)
        per_token = per_token + s.beta * kl_tok
    if s.entropy_coef != 0.0:  # bonus: lower loss for higher entropy
        per_token = per_token - s.entropy_coef * torch.where(valid, x.entropy.to(dtype),
                                                             torch.zeros_like(logp))

    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    loss = aggregate_loss(per_token, m, s.agg, max_len=s.max_len, normalizer=normalizer)
    return loss, _metrics(r, a, valid, s.clip_low, s.clip_high, kl_tok)


# The per-token surrogate per `loss_type`: (r, logp, old_logp, A, valid, settings, generator).
def _ppo(r, logp, old_logp, a, valid, s: LossSettings, generator) -> Tensor:
    return ppo_surrogate(r, a, s.clip_low, s.clip_high, s.dual_clip)


def _cispo(r, logp, old_logp, a, valid, s: LossSettings, generator) -> Tensor:
    return cispo_surrogate(r, logp, a, s.clip_low, s.clip_high)


def _gpg(r, logp, old_logp, a, valid, s: LossSettings, generator) -> Tensor:
    return -a * logp


def _clip_cov(r, logp, old_logp, a, valid, s: LossSettings, generator) -> Tensor:
    return clip_cov_surrogate(r, logp, a, valid, s.clip_low, s.clip_high, cov_ratio=s.cov_ratio,
                              cov_lb=s.cov_lb, cov_ub=s.cov_ub, generator=generator)


def _kl_cov(r, logp, old_logp, a, valid, s: LossSettings, generator) -> Tensor:
    return kl_cov_surrogate(r, logp, torch.where(valid, old_logp, torch.zeros_like(old_logp)), a,
                            valid, cov_ratio=s.cov_ratio, kl_cov_coef=s.kl_cov_coef)


class _Surrogate(NamedTuple):
    fn: Callable[..., Tensor]
    takes_dual_clip: bool = False


# the per-token surrogate per `loss_type` (algo.loss_type; mmrl.algos.surrogates)
_SURROGATES = {"ppo": _Surrogate(_ppo, takes_dual_clip=True), "cispo": _Surrogate(_cispo),
               "gpg": _Surrogate(_gpg), "clip_cov": _Surrogate(_clip_cov),
               "kl_cov": _Surrogate(_kl_cov)}
assert tuple(_SURROGATES) == LOSS_TYPES, "a loss_type without its surrogate here"
