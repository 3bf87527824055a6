"""The methods from the papers: label-free majority vote (TTRL / MM-UPT), history-aware prompt
filtering (ReST-GRPO / Temporal-R1), ground-truth guidance with the soft advantage (TempSamp-R1),
against hand-computed values."""
import math

import pytest
import torch

from mmrl import algos
from rewards import get_reward
from rewards.label_free import group_majorities, majority_error, majority_vote


# ---------------------------------------------------------------- majority vote ---------------
def test_majority_vote_scores_agreement_with_the_groups_majority():
    comps = ["<answer>3</answer>", "<think>x</think><answer>3.0</answer>", "<answer>4</answer>",
             "no tags 3", "<answer>red</answer>", "<answer>Red.</answer>", "<answer>blue</answer>",
             ""]
    groups = [7, 7, 7, 7, 2, 2, 2, 2]
    # group 7: keys 3.0, 3.0, 4.0, 3.0 ("no tags 3" -> whole text, not a number -> text key)
    out = majority_vote(comps, [None] * 8, group_id=groups)
    assert out == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert group_majorities(comps, groups) == {"7": ("3.0", 0.5), "2": ("red", 0.5)}


def test_min_agreement_threshold_none_or_zero():
    comps = ["<answer>1</answer>", "<answer>2</answer>", "<answer>2</answer>", "<answer>3</answer>"]
    g = [0, 0, 0, 0]  # majority "2" with share 2/4 = 0.5
    assert majority_vote(comps, [None] * 4, group_id=g, min_agreement=0.5) == [0.0, 1.0, 1.0, 0.0]
    assert majority_vote(comps, [None] * 4, group_id=g, min_agreement=0.75) == [None] * 4
    assert majority_vote(comps, [None] * 4, group_id=g, min_agreement=0.75, below="zero") == [0.0] * 4


def test_ties_go_to_the_first_answer_and_empty_groups_have_no_majority():
    assert majority_vote(["<answer>b</answer>", "<answer>a</answer>"], [None] * 2,
                         group_id=[1, 1]) == [1.0, 0.0]
    assert majority_vote(["", "<answer></answer>"], [None] * 2, group_id=[1, 1]) == [None, None]


def test_majority_vote_needs_group_ids_and_is_registered():
    with pytest.warns(RuntimeWarning, match="group_id"):
        assert majority_vote(["<answer>1</answer>", ""], [None] * 2) == [1.0, None]
    assert get_reward("majority_vote") is majority_vote


def test_majority_error_counts_only_labelled_groups():
    comps = ["<answer>3</answer>", "<answer>3</answer>", "<answer>5</answer>", "<answer>5</answer>",
             "<answer>1</answer>", "<answer>1</answer>"]
    # group 0 right (3), group 1 wrong (5 vs 4), group 2 unlabelled
    assert majority_error(comps, ["3", "3", 4, 4, None, None], [0, 0, 1, 1, 2, 2]) == (2, 1)


# ---------------------------------------------------------------- prompt history --------------
def _visit(h, scores_by_prompt):
    keys, scores, gids = [], [], []
    for g, (key, s) in enumerate(scores_by_prompt.items()):
        keys += [key] * len(s); scores += s; gids += [g] * len(s)
    h.observe(keys, torch.tensor(scores), torch.tensor(gids))


def test_history_filters_after_k_uninformative_visits_only():
    h = algos.PromptHistory(k=2)
    _visit(h, {"easy": [1., 1.], "hard": [0., 0.], "mixed": [1., 0.]})
    assert not h.filtered("easy"), "pending visits count only after commit"
    h.commit()
    assert not h.filtered("easy") and not h.filtered("hard"), "one visit < k"
    _visit(h, {"easy": [1., 1.], "hard": [1., 0.], "mixed": [0., 0.]})
    h.commit()
    assert h.filtered("easy") and not h.filtered("hard") and not h.filtered("mixed")
    assert h.row_weights(["easy", "hard", "new"], 0.25).tolist() == [0.25, 1.0, 1.0]
    _visit(h, {"easy": [0., 1.]})  # a later informative visit re-admits it
    h.commit()
    assert not h.filtered("easy")


def test_history_rest_readmits_a_skipped_prompt_on_its_next_pass():
    h = algos.PromptHistory(k=2)
    for _ in range(2):
        _visit(h, {"easy": [1., 1.]})
        h.commit()
    assert h.filtered("easy")
    h.rest("easy")  # skipped this pass: drawn again next pass
    assert not h.filtered("easy") and h.flags["easy"] == [True]
    _visit(h, {"easy": [1., 1.]})  # still uninformative: filtered again at once
    h.commit()
    assert h.filtered("easy")
    h.rest("never-seen")
    assert not h.filtered("never-seen")


def test_history_state_roundtrip():
    h = algos.PromptHistory(k=1)
    _visit(h, {"a": [1., 1.], "b": [0., 1.]})
    h.commit()
    h2 = algos.PromptHistory(k=1)
    h2.load_state_dict(h.state_dict())
    assert h2.flags == {"a": [True], "b": [False]} and h2.filtered("a")


# ---------------------------------------------------------------- GT guidance -----------------
def test_guidance_rows_pick_the_last_row_of_each_failed_group():
    s = torch.tensor([0.2, 0.9, 0.1, 0.0, 0.3, 0.3])
    g = torch.tensor([5, 1, 5, 1, 8, 8])  # max: g5 0.2, g1 0.9, g8 0.3
    assert algos.guidance_rows(s, g, threshold=0.5).tolist() == [False, False, True, False, False, True]
    assert not algos.guidance_rows(s, g, threshold=0.1).any()


def test_soft_rewards_hand_values_and_limits():
    r = torch.tensor([2.0, 1.0, 0.5, 0.0])
    got = algos.soft_rewards(r, tau=1.0, alpha_pos=2.0, alpha_neg=0.5).tolist()
    want = [1 + math.log(1 + 2 * 1.0) / 2, 1.0, 1 - (math.exp(0.25) - 1) / 0.5, 1 - (math.exp(0.5) - 1) / 0.5]
    assert got == pytest.approx(want, abs=1e-6)
    assert algos.soft_rewards(r, 1.0, 0.0, 0.0).tolist() == r.tolist()  # alphas 0: identity


def test_soft_guided_scores_touch_only_guided_groups():
    s = torch.tensor([1.5, 0.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    guided = torch.tensor([True, False, False, False])
    out = algos.soft_guided_scores(s, g, guided, 1.0, 1.0, 1.0)
    assert out.tolist() == pytest.approx([1 + math.log(1.5), 2 - math.e, 0.0, 1.0], abs=1e-6)


# ---------------------------------------------------------------- T-GRPO ----------------------
def test_temporal_bonus_follows_video_r1_rule():
    acc = torch.tensor([1., 0.05, 1., 0., 0.5, 0.5])
    g = torch.tensor([3, 3, 4, 4, 9, 9])  # p: g3 .525, g4 .5, g9 .5 (g9 has no shuffled rows)
    sacc = torch.tensor([0.5, 0.5, 1., 1.])
    sg = torch.tensor([3, 3, 4, 4])  # p~: g3 .5, g4 1
    # g3: .525 >= .8 * .5 -> correct rows (acc > .1) get .3; the 0.05 row does not.
    # g4: .5 < .8 * 1 -> nothing; g9: never contrasted -> nothing.
    out = algos.temporal_bonus(acc, g, sacc, sg, alpha=0.3, mu=0.8)
    assert out.tolist() == pytest.approx([0.3, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert algos.contrast_win_frac(acc, g, sacc, sg, mu=0.8) == 0.5
    assert algos.temporal_bonus(acc, g, sacc, sg, alpha=0.3, mu=0.5)[2] == pytest.approx(0.3)


def test_shuffle_frames_is_seeded_non_identity_and_keeps_timing():
    import numpy as np
    from mmrl.data.media import Video
    from mmrl.data.pretext import frame_permutation, shuffle_frames
    frames = np.arange(4).reshape(4, 1, 1, 1).repeat(3, -1).astype(np.uint8)
    v = Video(frames=frames, fps=2.0, timestamps=[0.0, 0.5, 1.0, 1.5], duration=2.0)
    s = shuffle_frames(v, seed=1)
    perm = frame_permutation(4, 1)
    assert perm != [0, 1, 2, 3] and sorted(perm) == [0, 1, 2, 3]
    assert s.frames[:, 0, 0, 0].tolist() == perm
    assert s.timestamps == v.timestamps and s.fps == v.fps
    assert shuffle_frames(v, seed=1).frames.tolist() == s.frames.tolist()
    assert v.frames[:, 0, 0, 0].tolist() == [0, 1, 2, 3], "input untouched"


# ---------------------------------------------------------------- think / no-think ------------
def test_think_kinds_shares_and_hybrid_format():
    from rewards.thinking import think_format, think_kind, think_shares
    assert [think_kind(t) for t in ["<think>x</think><answer>1</answer>", "<think>\n</think>1",
                                    "1", "</think><think>"]] == ["think", "empty", "none", "none"]
    assert think_shares([]) == {"think": 0.0, "empty": 0.0, "none": 0.0}
    comps = ["<think>a</think> <answer>1</answer>", "<answer>1</answer>",
             "<answer>1</answer>", "<think>a</think><answer>1</answer>",
             "<think>a</think><answer>1</answer> extra", "<think>a</think><think>b</think><answer>1</answer>"]
    modes = ["think", "no_think", None, None, "think", "think"]
    assert think_format(comps, [None] * 6, think_mode=modes) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_asks_nothink_is_stable_and_close_to_the_share():
    from mmrl.data.prepare import asks_nothink
    ids = [f"s{i}" for i in range(2000)]
    picks = [asks_nothink(i, 0.3, seed=0) for i in ids]
    assert picks == [asks_nothink(i, 0.3, seed=0) for i in ids]
    assert abs(sum(picks) / len(ids) - 0.3) < 0.04
    assert not any(asks_nothink(i, 0.0, 0) for i in ids) and all(asks_nothink(i, 1.0, 0) for i in ids)


def test_sft_stop_needs_its_readings_in_a_row():
    from mmrl.train.sft import reached

    # the classification row's seed 2: 0.63 then one lucky 0.71 against stop_accuracy 0.7
    history = [{"val_accuracy": a} for a in (0.576, 0.628, 0.711)]
    assert reached(history, 0.7, 1)
    assert not reached(history, 0.7, 2)
    assert reached(history + [{"val_accuracy": 0.70}], 0.7, 2)
    assert not reached(history[:1], 0.5, 2)  # fewer readings than checks: not yet
    assert not reached(history, None, 1)  # no stop_accuracy: run every step
