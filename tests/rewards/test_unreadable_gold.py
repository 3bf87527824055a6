"""A reward whose gold answer it cannot read returns None (so scored_frac shows the mismatch)
rather than 0.0; lower-case option letters are read."""
from __future__ import annotations

import pytest

from mmrl.config import RewardSpec
from mmrl.train.scoring import RewardSet
from mmrl.types import Sample
from rewards import get_reward

accuracy = get_reward("accuracy")


@pytest.mark.parametrize("mode, gold", [("choice", "12"), ("choice", "a red ball"),
                                        ("numeric", "B"), ("numeric", "left")])
def test_a_named_mode_that_cannot_read_the_gold_answer_returns_none(mode, gold):
    assert accuracy(["<answer>12</answer>", "", "<answer>B</answer>"], [gold] * 3,
                    mode=mode) == [None] * 3


def test_auto_and_exact_still_compare_strings():
    assert accuracy(["<answer>a red ball</answer>"], ["a red ball"]) == [1.0]
    assert accuracy(["<answer>left</answer>"], ["left"], mode="exact") == [1.0]


@pytest.mark.parametrize("answer, expected", [
    ("option b", 1.0), ("The answer is b.", 1.0), ("answer: (b)", 1.0), ("Option B", 1.0),
    ("the answer is a dog", 0.0), ("option c", 0.0)])
def test_lower_case_option_letters_are_read(answer, expected):
    assert accuracy([f"<answer>{answer}</answer>"], ["B"], mode="choice") == [expected]


def test_scored_frac_shows_records_the_letter_reward_cannot_read():
    """video_qa's synthetic set under a letter-only accuracy: numbers score None, not 0."""
    samples = [Sample(id=str(i), messages=[], solution=gold, task="video_qa")
               for i, gold in enumerate(["B", "7", "3.5", "C"])]
    rs = RewardSet([RewardSpec(name="accuracy", params={"mode": "choice"})])
    _, per = rs.score(samples, ["<answer>B</answer>"] * 4)
    assert per["accuracy"] == [1.0, None, None, 0.0]
    assert rs.step_metrics()["reward/accuracy/scored_frac"] == 0.5
