"""The trainer's watchers (mmrl/train/watch.py): each warns once, on the pattern it watches for,
with what to change; and the metrics they read."""
from __future__ import annotations

import torch

from mmrl import algos, config
from mmrl.train.rollout_utils import cut_after_answer_frac, rollout_metrics
from mmrl.train.watch import (CUT_FRAC, CUT_RISE, CUT_STEPS, SIGNAL_FRAC, SIGNAL_STEPS,
                              SILENT_STEPS, CutWatch, FailingTools, SignalWatch,
                              SilentRewards)
from mmrl.types import RolloutBatch, ScoredBatch


def _feed(watch, rows: list[dict]) -> list[str]:
    said: list[str] = []
    for metrics in rows:
        watch(metrics, said.append)
    return said


def _cut(frac: float, after: float = 0.0) -> dict:
    return {"completion/truncated_frac": frac, "completion/cut_after_answer_frac": after}


def test_cut_completions_warn_once_after_ten_steps_in_a_row():
    watch = CutWatch(24)
    # Nine cut steps, one that ends (resets the streak), nine more: nothing yet.
    said = _feed(watch, [_cut(0.97)] * (CUT_STEPS - 1) + [_cut(0.2)] + [_cut(CUT_FRAC)] * 9)
    assert said == []
    said = _feed(watch, [_cut(0.97)] * 5)
    assert len(said) == 1  # the tenth in a row warns; later ones do not repeat it
    assert "97% of completions hit rollout.max_new_tokens (24) for 10 steps" in said[0]
    # No whole answer in the cut ones: the budget is short.
    assert "raise rollout.max_new_tokens (e.g. to 48)" in said[0]


def test_a_cut_share_rising_under_the_fixed_threshold_warns_with_both_ends():
    """The omni row's drift: from no cut completions to 48% by step 150, never half of them."""
    rising = [_cut(0.0)] * 20 + [_cut(min(0.48, 0.02 * k), 0.9 * min(0.48, 0.02 * k))
                                 for k in range(1, 60)]
    said = _feed(CutWatch(8), rising)
    assert len(said) == 1
    # The first window mean 0.2 above the lowest (0%): rise steps 6..15 at 0.02 * k, mean 0.21.
    assert "rose from 0% to 21% (mean of 10 steps)" in said[0]
    assert "completion/cut_after_answer_frac" in said[0]
    assert "stopped ending its answers" in said[0] and "text_after" in said[0]


def test_a_steady_cut_share_is_no_trend():
    # 30% cut from the start (a budget a little short for some answers) never rises by CUT_RISE.
    assert _feed(CutWatch(8), [_cut(0.3)] * 100) == []
    # A share that falls, then comes back to where it started, rose from the lowest window.
    said = _feed(CutWatch(8), [_cut(0.4)] * 10 + [_cut(0.1)] * 10 + [_cut(0.1 + CUT_RISE)] * 10)
    assert len(said) == 1 and "rose from 10% to 30%" in said[0]


def test_cut_after_answer_share_counts_only_cut_completions_with_text_after_a_whole_answer():
    texts = ["<answer>C</answer>C</answer", "<answer>C</answer>", "<answer>C",
             "<answer>C</answer> \n", "<answer>C</answer> more"]
    assert cut_after_answer_frac(texts, [True, False, True, True, False]) == 1 / 5
    assert cut_after_answer_frac([], []) == 0.0


def test_rollout_metrics_report_the_cut_after_answer_share_and_zero_std_groups():
    texts = ["<answer>A</answer>A</answer", "<answer>A</answer>", "<answer>B</answer>",
             "<answer>B</answer>"]
    batch = RolloutBatch(prompts=[], completion_ids=torch.ones(4, 3, dtype=torch.long),
                         completion_mask=torch.ones(4, 3), group_ids=torch.tensor([0, 0, 1, 1]),
                         sampler_logp=None, texts=texts,
                         truncated=torch.tensor([True, False, False, False]))
    scores = torch.tensor([1.0, 1.1, 0.0, 0.0])  # group 0 differs, group 1 scored alike
    sb = ScoredBatch(rollout=batch, scores=scores, per_reward={}, advantages=scores)
    m = rollout_metrics(sb, [])
    assert m["completion/cut_after_answer_frac"] == 0.25 and m["completion/truncated_frac"] == 0.25
    assert m["groups/zero_std_frac"] == 0.5
    assert m["groups/solved_frac"] == 0.0  # group 1 scored alike at 0, below the best (1.1)
    assert (m["reward/total_max"], m["reward/total_min"]) == (1.100000023841858, 0.0)


def _algo(*overrides) -> config.AlgoConfig:
    return config.load(None, ["data.train=x.jsonl", *overrides]).algo


def test_little_signal_left_warns_once_on_the_window_mean_with_the_share():
    # Classification seed 3: 73% of groups scored alike late in RL.
    quiet = [{"groups/zero_std_frac": 0.5}] * 40
    late = [{"groups/zero_std_frac": v} for v in [0.6, 0.85] * 30]  # no 20 in a row >= 0.7
    watch = SignalWatch(_algo())
    assert _feed(watch, quiet) == []
    said = _feed(watch, late)
    assert len(said) == 1
    # The 18th late step: two 0.5s, nine 0.6s and nine 0.85s in the window, mean 0.7025.
    assert "little signal left: in 70% of groups" in said[0]
    assert "groups/zero_std_frac" in said[0] and "algo.dynamic_sampling=true" in said[0]
    below = [{"groups/zero_std_frac": SIGNAL_FRAC - 0.01}] * (3 * SIGNAL_STEPS)
    assert _feed(SignalWatch(_algo()), below) == []


def test_groups_alike_because_every_completion_is_right_are_not_little_signal():
    # The quickstart at the end of RL: held-out accuracy 1.00, most groups all right.
    s = torch.tensor([1.1, 1.1, 1.1, 1.1, 0.1, 1.1, 0.1, 0.1])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert algos.frac_zero_std_groups(s, g) == 0.75 and algos.frac_solved_groups(s, g) == 0.5
    early = [{"groups/zero_std_frac": 0.2, "groups/solved_frac": 0.0, "reward/total_max": 1.1,
              "reward/total_min": 0.0}] * 5  # the run has seen scores differ, up to 1.1
    solved = [{"groups/zero_std_frac": 0.9, "groups/solved_frac": 0.85, "reward/total_max": 1.1,
               "reward/total_min": 0.1}] * (3 * SIGNAL_STEPS)
    done = [{"groups/zero_std_frac": 1.0, "groups/solved_frac": 1.0, "adv/all_zero": 1.0,
             "reward/total_max": 1.1, "reward/total_min": 1.1}] * (3 * SILENT_STEPS)
    assert _feed(SignalWatch(_algo()), early + solved + done) == []
    stuck = [{"groups/zero_std_frac": 0.9, "groups/solved_frac": 0.1, "reward/total_max": 1.1,
              "reward/total_min": 0.0}] * SIGNAL_STEPS
    said = _feed(SignalWatch(_algo()), stuck)
    assert len(said) == 1 and "in 80% of groups every completion scored the same, below" in said[0]


def test_a_run_that_never_saw_two_scores_differ_has_solved_nothing():
    # Every completion scored 0 from the first step: alike "at the step's best", but not solved.
    wrong = [{"groups/zero_std_frac": 1.0, "groups/solved_frac": 1.0, "adv/all_zero": 1.0,
              "reward/total_max": 0.0, "reward/total_min": 0.0}] * SILENT_STEPS
    said = _feed(SignalWatch(_algo()), wrong)
    assert len(said) == 1 and "every advantage was 0 for 10 steps" in said[0]
    # Alike at a step's best that is below the run's best (the policy got worse): not solved.
    worse = [{"groups/zero_std_frac": 0.9, "groups/solved_frac": 0.9, "reward/total_max": 0.1,
              "reward/total_min": 0.1}] * SIGNAL_STEPS
    watch = SignalWatch(_algo())
    _feed(watch, [{"reward/total_max": 1.1, "reward/total_min": 0.0}])
    assert len(_feed(watch, worse)) == 1


def test_every_advantage_zero_warns_once_and_the_little_signal_warning_stays_quiet():
    rows = [{"adv/all_zero": 1.0, "groups/zero_std_frac": 1.0}] * (SIGNAL_STEPS + 5)
    said = _feed(SignalWatch(_algo("algo.advantage=reinforce", "algo.pos_weight=0")), rows)
    assert len(said) == 1
    assert "every advantage was 0 for 10 steps" in said[0] and "algo.reward_offset=-1" in said[0]
    said = _feed(SignalWatch(_algo()), rows)
    assert len(said) == 1 and "algo.dynamic_sampling=true" in said[0]
    # One step with signal resets the streak.
    watch = SignalWatch(_algo())
    flat = [{"adv/all_zero": 1.0}] * (SILENT_STEPS - 1)
    assert _feed(watch, flat + [{"adv/all_zero": 0.0}] + flat) == []


def test_a_reward_that_scores_nothing_for_ten_steps_is_named_once():
    rows = [{"reward/tiou_v2/scored_frac": 0.0, "reward/format/scored_frac": 1.0}] * 15
    said = _feed(SilentRewards(), rows)
    assert len(said) == 1
    assert "'tiou_v2' scored none of its samples for 10 steps" in said[0]


def test_every_tool_call_failing_for_many_steps_warns_once_with_the_kind():
    """The video_search layer's 8-frame results over the frames guard came back as bad_result
    on every call for 100 steps, and the run said nothing: this watcher says it at step 10."""
    failing = {"tools/calls_mean": 0.7, "tools/error_rate": 1.0, "tools/errors/bad_result": 0.69,
               "tools/errors/malformed": 0.01, "tools/errors/timeout": 0.0}
    said = _feed(FailingTools(), [failing] * (SILENT_STEPS - 1))
    assert said == []
    said = _feed(FailingTools(), [failing] * (SILENT_STEPS + 5))
    assert len(said) == 1 and "every tool call failed for 10 steps (most often bad_result)" in said[0]
    # a step with one working call, or with no call at all, breaks the streak
    some_work = dict(failing, **{"tools/error_rate": 0.9})
    no_calls = {"tools/calls_mean": 0.0, "tools/error_rate": 0.0}
    rows = ([failing] * (SILENT_STEPS - 1) + [some_work]) * 2 + [no_calls] * SILENT_STEPS
    assert _feed(FailingTools(), rows) == []
