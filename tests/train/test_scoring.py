"""Reward binding and per-sample task routing in a mixed-task batch."""
import pytest

from mmrl.config import RewardSpec
from mmrl.train.scoring import RewardSet, bind_reward
from mmrl.types import Sample


def _s(task, solution, **fields):
    return Sample(id=task, messages=[], solution=solution, task=task, fields=fields)


def test_mixed_batch_is_scored_by_each_samples_task_rewards():
    rs = RewardSet([RewardSpec(name="count", weight=1.0, tasks=["counting"]),
                    RewardSpec(name="iou", weight=2.0, tasks=["detection"]),
                    RewardSpec(name="format", weight=0.5, params={"think": False})])
    samples = [_s("counting", "3"), _s("detection", [0, 0, 10, 10]), _s("counting", "2")]
    completions = ["<answer>3</answer>", "<answer>[0, 0, 5, 10]</answer>", "<answer>4</answer>"]
    totals, per = rs.score(samples, completions)
    assert per["count"] == [1.0, None, 0.0]
    assert per["iou"] == [None, 0.5, None]
    assert per["format"] == [1.0, 1.0, 1.0]
    assert totals == pytest.approx([1.0 + 0.5, 2 * 0.5 + 0.5, 0.0 + 0.5])


def test_same_reward_twice_gets_distinct_keys_and_params_bind():
    rs = RewardSet([RewardSpec(name="iou"), RewardSpec(name="iou", params={"threshold": 0.75})])
    assert rs.keys == ["iou_0", "iou_1"]
    _, per = rs.score([_s("detection", [0, 0, 10, 10])], ["<answer>[0, 0, 5, 10]</answer>"])
    assert per == {"iou_0": [0.5], "iou_1": [0.0]}


def test_unknown_param_and_unknown_reward_fail_at_bind_time():
    with pytest.raises(TypeError, match="bogus"):
        bind_reward(RewardSpec(name="iou", params={"bogus": 1}))
    with pytest.raises(KeyError, match="nosuch"):
        bind_reward(RewardSpec(name="nosuch"))
