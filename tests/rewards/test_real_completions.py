"""Reward parsing of what models really write (issue 11): each case scored 0 or None before."""
from rewards import get_reward


def test_choice_keyword_any_case():
    acc = get_reward("accuracy")
    outs = ["<answer>Option B</answer>", "<answer>Answer: B</answer>",
            "<answer>THE ANSWER IS B</answer>", "<answer>the answer is a dog</answer>"]
    assert acc(outs, ["B"] * 4, options=[["A. cat", "B. bird"]] * 4, mode="choice") == [
        1.0, 1.0, 1.0, 0.0]


def test_tiou_reads_upper_case_connectors():
    tiou = get_reward("tiou")
    assert tiou(["<answer>1 TO 2</answer>", "<answer>1 AND 2</answer>", "<answer>1 To 2 S</answer>"],
                [[1, 2]] * 3) == [1.0, 1.0, 1.0]


def test_detection_reads_visual_rft_position_boxes():
    det, iou = get_reward("detection"), get_reward("iou")
    out = '<answer>[{"Position": [10, 10, 50, 50], "Confidence": 0.9}]</answer>'
    gold = '[{"Position": [10, 10, 50, 50], "Confidence": 1}]'
    assert det([out], [gold]) == [1.0]
    assert iou([out], [[10, 10, 50, 50]]) == [1.0]


def test_count_is_strict_about_hedges_and_think_only_answers():
    count = get_reward("count")
    outs = ["<answer>4 or 3</answer>", "<think>there are 3</think>", "<think>hm</think>3",
            "<answer>There are three.</answer>", "<think>4? no</think><answer>3</answer>",
            "<answer>3 cats, 3 in total</answer>"]
    assert count(outs, ["3"] * 6) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_numbers_sprayed_into_garbage_score_nothing():
    """Seen in a learning-table run: the policy collected tIoU 0.7 and IoU 0.12 on garbage such as
    these, because the parsers took the first pair / any four numbers anywhere in the text."""
    tiou, iou = get_reward("tiou"), get_reward("iou")
    assert tiou(["\x010, d say0,5]</answerobjectanswer>[AN0]</answer>[0,5,5,",
                 "<answer>[0,6,5,5]</answer>", "<answer>1 to 2 or 3 to 4</answer>",
                 "<answer>from 1:05 to 1:10</answer>", "<answer>[0, 5]</answer>"],
                [[0, 5]] * 4 + [[0, 5]]) == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert iou(["<answer>[2.0, answer>[4.0, 44.0, 55.0]</answer>", "<answer>10 20 30 40</answer>",
                "<answer>box 10 20 then 30 40</answer>"],
               [[10, 20, 30, 40]] * 3, coords="absolute") == [0.0, 1.0, 0.0]
