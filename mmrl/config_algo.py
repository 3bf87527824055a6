"""The algorithm's part of the run configuration (`algo:`): the loss, the advantage, the
knobs and methods, and what each `algo.preset` means. Re-exported by mmrl.config, where the
rest of the configuration lives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

Preset = Literal["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "gpg", "cispo"]
Agg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
Ratio = Literal["token", "sequence"]  # sequence = GSPO
KL = Literal["k1", "k2", "k3"]
ISLevel = Literal["token", "sequence", "geometric"]  # geometric: per-token mean of the sequence's
ISMode = Literal["truncate", "mask"]  # truncate: min(w, cap) | mask: 0 outside [1/cap, cap]
HistoryMode = Literal["skip", "downweight"]  # filtered prompts: never drawn again | advantages scaled
ScaleRewards = Literal["group", "batch", "none"]  # as TRL's scale_rewards
LossType = Literal["ppo", "cispo", "gpg", "clip_cov", "kl_cov"]


@dataclass
class AlgoConfig:
    preset: Optional[Preset] = None  # fills its family's keys under those set explicitly
    advantage: str = "grpo"  # `mmrl ls algos`, or "pkg.mod:fn"
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2  # see clip_low (DAPO: 0.28)
    agg: Agg = "seq_mean_token_mean"  # how token losses become one number (docs/algorithms.md)
    ratio: Ratio = "token"  # importance ratio per token, or per sequence (GSPO)
    beta: float = 0.0  # KL weight; 0 loads no reference model
    kl: KL = "k3"  # KL estimator for the loss (Schulman's k1, k2, k3)
    num_iterations: int = 1  # updates per rollout (>1 reuses it with stored old logprobs)
    dynamic_sampling: bool = False  # DAPO: drop zero-std groups, sample until the batch is full
    max_sampling_rounds: int = 8  # dynamic_sampling: give up filling the batch after N rounds
    overlong_filter: bool = False  # DAPO: mask truncated completions out of the loss
    tis_cap: Optional[float] = None  # importance sampling vs the rollout engine: upper threshold (e.g. 2)
    tis_level: ISLevel = "token"  # sequence: product of token ratios | geometric: its token mean
    tis_mode: ISMode = "truncate"  # mask = rejection sampling
    # All knobs below are off by default (the behaviour before each existed); docs/algorithms.md
    # names the peer each follows.

    scale_rewards: Optional[ScaleRewards] = None  # grpo / grpo_passk only
    loss_type: LossType = "ppo"  # the surrogate (docs/algorithms.md)
    dual_clip: Optional[float] = None  # dual-clip c > 1 for A < 0 tokens (verl/EasyR1 use 3)
    entropy_coef: float = 0.0  # entropy bonus: loss -= coef * token entropy
    kl_clamp: Optional[float] = None  # clamp the k3 value to [-c, c] (verl: 10)
    kl_reward_coef: float = 0.0  # KL in the reward instead of the loss: r -= coef * sum_t KL_t
    kl_reward_kind: KL = "k1"  # estimator for the reward KL (verl's default kl_penalty: kl = k1)
    kl_reward_target: Optional[float] = None  # adaptive controller target KL (None: fixed coef)
    kl_reward_horizon: float = 10000.0  # adaptive controller horizon, in samples
    cov_ratio: float = 2e-4  # clip_cov / kl_cov: share of tokens selected by covariance
    cov_lb: float = 1.0  # clip_cov: covariance band (lb, ub) of eligible tokens
    cov_ub: float = 5.0  # see cov_lb
    kl_cov_coef: float = 1.0  # kl_cov: weight of |logp - old_logp| on the selected tokens
    pos_weight: float = 1.0  # scales positive advantages (W-REINFORCE: 0.1; NSR: 0)
    neg_weight: float = 1.0  # scales negative advantages (PSR: 0)
    # added to every total reward before the advantages: NSR/PSR's +-1 from 0/1 accuracy is
    # weight 2 and offset -1 (baselines that centre on the group mean cancel it)
    reward_offset: float = 0.0
    ref_reset_every: int = 0  # ProRL: reference := current policy every N steps (0 = never)
    # Methods from the papers (docs/methods.md); every one is off by default.

    history_epochs: int = 0  # ReST-GRPO/Temporal-R1: filter prompts all-solved/none-solved on their last k visits (0 = off)
    history_mode: HistoryMode = "skip"  # downweight: advantages * history_weight
    history_weight: float = 0.1  # history_mode=downweight: advantage factor of filtered prompts
    gt_threshold: Optional[float] = None  # TempSamp-R1: group max reward < this -> one row becomes the ground truth (None = off)
    gt_template: str = "<answer>{solution}</answer>"  # the recipe's answer format for that row
    gt_tau: float = 1.0  # soft advantage pivot: rewards above it are log-compressed, below exp-stretched
    gt_alpha_pos: float = 1.0  # compression strength above gt_tau (0 = linear)
    gt_alpha_neg: float = 1.0  # stretch strength below gt_tau (0 = linear)
    tgrpo_alpha: float = 0.0  # T-GRPO (Video-R1 0.3): bonus for correct samples when order helps (0 = off)
    tgrpo_mu: float = 0.8  # order "helps" when ordered accuracy >= mu * shuffled accuracy
    tgrpo_reward: Optional[str] = None  # reward key giving accuracy (None: the first reward)

    @property
    def uses_reference(self) -> bool:
        """A reference model is needed for the KL loss or the KL in the reward."""
        return self.beta > 0 or self.kl_reward_coef > 0

    @property
    def history_skips(self) -> bool:
        """history_mode=skip: filtered prompts are skipped when drawn."""
        return self.history_mode == "skip"

    @property
    def history_downweights(self) -> bool:
        """history_mode=downweight: filtered prompts' advantages are scaled by history_weight."""
        return self.history_mode == "downweight"


# What each preset means; applied under explicit YAML/CLI values.
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "grpo", "agg": "seq_mean_token_mean"},
    "dr_grpo": {"advantage": "dr_grpo", "agg": "seq_mean_token_sum_norm"},
    "dapo": {"advantage": "grpo", "agg": "token_mean", "clip_high": 0.28,
             "dynamic_sampling": True, "overlong_filter": True},
    "gspo": {"advantage": "grpo", "ratio": "sequence", "agg": "seq_mean_token_mean",
             "clip_low": 3e-4, "clip_high": 4e-4},
    "rloo": {"advantage": "rloo", "agg": "token_mean"},
    "reinforce_pp": {"advantage": "reinforce_pp", "agg": "token_mean"},
    "gpg": {"advantage": "gpg", "loss_type": "gpg", "agg": "token_mean"},
    "cispo": {"advantage": "grpo", "loss_type": "cispo", "agg": "token_mean", "clip_low": 1.0,
              "clip_high": 0.28},
}
