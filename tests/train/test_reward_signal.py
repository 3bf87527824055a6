"""Signal the update can learn from: algo.reward_offset gives NSR/PSR their +-1 rewards, a run
whose every advantage is 0 for 10 steps is warned about, and the KL in the reward honours
algo.kl_clamp as the loss does."""
from __future__ import annotations

import math

import pytest
import torch

from mmrl import algos, config
from mmrl.train.dist import DistInfo
from mmrl.train.scoring import Scorer
from mmrl.train.watch import SILENT_STEPS, SignalWatch
from mmrl.types import RolloutBatch, ScoredBatch

GROUPS = torch.tensor([0, 0, 1, 1])


def _scorer(*overrides):
    cfg = config.load(None, ["data.train=x.jsonl", "rewards=[{name: accuracy, weight: 2}]",
                             "algo.advantage=reinforce", *overrides])
    return Scorer(cfg, DistInfo())


def test_nsr_with_0_1_accuracy_learns_nothing_until_the_offset_makes_it_plus_minus_1():
    scores = torch.tensor([2.0, 0.0, 0.0, 2.0])  # accuracy 1, 0, 0, 1 at weight 2
    lengths = torch.ones(4)
    plain = _scorer("algo.pos_weight=0")
    assert plain.advantages(scores, GROUPS, lengths).tolist() == [0.0] * 4
    nsr = _scorer("algo.pos_weight=0", "algo.reward_offset=-1")
    assert nsr.advantages(scores, GROUPS, lengths).tolist() == [0.0, -1.0, -1.0, 0.0]
    psr = _scorer("algo.neg_weight=0", "algo.reward_offset=-1")
    assert psr.advantages(scores, GROUPS, lengths).tolist() == [1.0, 0.0, 0.0, 1.0]


def test_every_advantage_zero_for_ten_steps_warns_once_with_what_to_do():
    scorer, warned = _scorer("algo.pos_weight=0"), []
    watch = SignalWatch(scorer.algo)
    for step in range(SILENT_STEPS + 3):
        scorer.advantages(torch.tensor([2.0, 0.0, 0.0, 2.0]), GROUPS, torch.ones(4))
        metrics = scorer.step_metrics()
        assert metrics["adv/all_zero"] == 1.0
        watch(metrics, warned.append)
        assert len(warned) == (step + 1 >= SILENT_STEPS)
    assert "every advantage was 0 for 10 steps" in warned[0]
    assert "algo.reward_offset=-1" in warned[0]
    # A step with signal is reported as such.
    scorer.advantages(torch.tensor([2.0, 0.0, 0.0, 2.0]) - 1, GROUPS, torch.ones(4))
    assert scorer.step_metrics()["adv/all_zero"] == 0.0


def test_kl_in_the_reward_is_clamped_like_the_loss():
    logp, ref = torch.zeros(1, 3), torch.full((1, 3), 5.0)  # k3 = e^5 - 5 - 1 = 142.4 a token
    mask = torch.ones(1, 3)
    free, _ = algos.kl_in_reward(torch.zeros(1), logp, ref, mask, 1.0, "k3")
    clamped, kl = algos.kl_in_reward(torch.zeros(1), logp, ref, mask, 1.0, "k3", clamp=10.0)
    assert free.item() == pytest.approx(-3 * (math.exp(5) - 6))
    assert clamped.item() == pytest.approx(-30.0) and kl.item() == pytest.approx(10.0)
    scorer = _scorer("algo.kl_reward_coef=0.5", "algo.kl_reward_kind=k3", "algo.kl_clamp=10")
    batch = RolloutBatch(prompts=[], completion_ids=torch.zeros(1, 3, dtype=torch.long),
                         completion_mask=mask, group_ids=torch.zeros(1, dtype=torch.long),
                         sampler_logp=None, texts=[""], truncated=torch.zeros(1, dtype=torch.bool))
    sb = ScoredBatch(rollout=batch, scores=torch.ones(1), per_reward={}, advantages=torch.ones(1),
                     old_logp=logp, ref_logp=ref)
    assert scorer.kl_in_reward(sb, {}, {}).item() == pytest.approx(1.0 - 0.5 * 30.0)
