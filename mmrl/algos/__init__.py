"""Pure RL algorithms over tensors (imports only torch and the standard library): advantages,
policy loss and its surrogates, KL (as a loss or in the reward), off-policy correction, DAPO
sampling helpers and memory-light log-prob/entropy. See each module's docstring for formulas."""
from mmrl.algos.advantages import (ADVANTAGES, SCALE_MODES, compute_advantages, get_advantage, group_stats,
                                   weight_by_sign)
from mmrl.algos.guidance import guidance_rows, in_guided_groups, soft_guided_scores, soft_rewards
from mmrl.algos.correction import IS_LEVELS, IS_MODES, is_weights, tis_metrics, tis_weights
from mmrl.algos.decoupled import behaviour_weights, decoupled_loss
from mmrl.algos.kl import KL_KINDS, KLController, kl_in_reward, kl_penalty
from mmrl.algos.logprob import entropy_from_logits, selective_log_softmax
from mmrl.algos.losses import (AGG_MODES, RATIO_LEVELS, LossInputs, LossSettings, aggregate_loss,
                               importance_ratio, loss_normalizer, policy_loss)
from mmrl.algos.sampling import (
    HISTORY_MODES,
    GroupAccumulator,
    PromptHistory,
    frac_solved_groups,
    frac_zero_std_groups,
    group_has_signal,
    groups_with_signal,
    overlong_filter_mask,
)
from mmrl.algos.surrogates import LOSS_TYPES
from mmrl.algos.temporal import contrast_win_frac, temporal_bonus

__all__ = [
    "ADVANTAGES",
    "HISTORY_MODES",
    "PromptHistory",
    "guidance_rows",
    "in_guided_groups",
    "soft_guided_scores",
    "soft_rewards",
    "contrast_win_frac",
    "temporal_bonus",
    "AGG_MODES",
    "IS_LEVELS",
    "IS_MODES",
    "KL_KINDS",
    "KLController",
    "LossInputs",
    "LossSettings",
    "LOSS_TYPES",
    "RATIO_LEVELS",
    "SCALE_MODES",
    "GroupAccumulator",
    "aggregate_loss",
    "behaviour_weights",
    "compute_advantages",
    "decoupled_loss",
    "entropy_from_logits",
    "frac_solved_groups",
    "frac_zero_std_groups",
    "get_advantage",
    "group_has_signal",
    "group_stats",
    "groups_with_signal",
    "importance_ratio",
    "is_weights",
    "kl_in_reward",
    "kl_penalty",
    "loss_normalizer",
    "overlong_filter_mask",
    "policy_loss",
    "selective_log_softmax",
    "tis_metrics",
    "tis_weights",
    "weight_by_sign",
]
