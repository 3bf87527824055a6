"""The Learner's loss settings come from the config once, and a bad combination fails there."""
import pytest

from mmrl import config
from mmrl.train.learner import loss_settings


def test_loss_settings_take_the_algo_knobs_and_the_generation_budget():
    cfg = config.load(None, ["data.train=x.jsonl", "algo.clip_high=0.28", "algo.beta=0.04",
                             "algo.loss_type=clip_cov", "algo.cov_ub=4.0",
                             "rollout.max_new_tokens=7"])
    s = loss_settings(cfg)
    assert (s.clip_high, s.beta, s.loss_type, s.cov_ub, s.max_len) == (0.28, 0.04, "clip_cov", 4.0, 7)
    assert s.agg == cfg.algo.agg and s.kl == cfg.algo.kl


def test_a_bad_knob_combination_fails_when_the_settings_are_built():
    cfg = config.load(None, ["data.train=x.jsonl", "algo.loss_type=cispo", "algo.dual_clip=3.0"])
    with pytest.raises(ValueError, match="dual_clip applies to loss_type 'ppo' only"):
        loss_settings(cfg)
