"""Pure RL algorithms over tensors (imports only torch): advantages, policy loss, KL, DAPO
sampling helpers and memory-light log-prob/entropy. See each module's docstring for formulas."""
from mmrl.algos.advantages import ADVANTAGES, compute_advantages, group_stats
from mmrl.algos.kl import KL_KINDS, kl_penalty
from mmrl.algos.logprob import entropy_from_logits, selective_log_softmax
from mmrl.algos.losses import AGG_MODES, RATIO_LEVELS, aggregate_loss, importance_ratio, policy_loss
from mmrl.algos.sampling import (
    GroupAccumulator,
    frac_zero_std_groups,
    group_has_signal,
    groups_with_signal,
    overlong_filter_mask,
)

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_KINDS",
    "RATIO_LEVELS",
    "GroupAccumulator",
    "aggregate_loss",
    "compute_advantages",
    "entropy_from_logits",
    "frac_zero_std_groups",
    "group_has_signal",
    "group_stats",
    "groups_with_signal",
    "importance_ratio",
    "kl_penalty",
    "overlong_filter_mask",
    "policy_loss",
    "selective_log_softmax",
]
