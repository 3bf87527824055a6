"""The tool_use reward: a bonus only for a correct answer reached with a tool call that worked
(DeepEyes' conditional form), hand-checked, and as a property over arbitrary calls."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import REWARDS, get_reward

tool_use = get_reward("tool_use")
OK = {"name": "crop", "turn": 0, "error": None}
BAD = {"name": "", "turn": 0, "error": "malformed"}


def test_the_bonus_needs_a_correct_answer_and_a_call_that_worked():
    completions = ["<answer>B</answer>"] * 4 + ["<answer>A</answer>"]
    calls = [[OK], [], [BAD], [BAD, OK], [OK, OK]]
    assert tool_use(completions, ["B"] * 5, calls=calls) == [1.0, 0.0, 0.0, 1.0, 0.0]
    # two working calls asked for; by multiple-choice letter through the options field
    assert tool_use(["<answer>B</answer>"] * 2, ["B", "B"], calls=[[OK], [OK, OK]],
                    min_calls=2) == [0.0, 1.0]
    assert tool_use(["<answer>dog</answer>"], ["B"], calls=[[OK]],
                    options=[["A. cat", "B. dog"]]) == [1.0]


def test_rows_without_calls_are_not_scored():
    assert tool_use(["<answer>B</answer>"] * 2, ["B", "B"]) == [None, None]
    assert tool_use(["<answer>B</answer>"] * 2, ["B", "B"], calls=[[OK], "crop"]) == [1.0, None]
    assert REWARDS.params("tool_use")["correct"] == "accuracy"


call = st.fixed_dictionaries({"name": st.sampled_from(["crop", "", "x"]), "turn": st.integers(0, 3),
                              "error": st.one_of(st.none(), st.sampled_from(
                                  ["malformed", "bad_box", "timeout"]))})


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["A", "B", "C", "x", ""]),
                               st.sampled_from(["A", "B"]), st.lists(call, max_size=4)),
                     min_size=1, max_size=8),
       min_calls=st.integers(0, 3))
def test_the_bonus_is_paid_exactly_when_correct_with_enough_working_calls(rows, min_calls):
    completions = [f"<answer>{a}</answer>" for a, _, _ in rows]
    solutions = [s for _, s, _ in rows]
    calls = [c for _, _, c in rows]
    scores = tool_use(completions, solutions, calls=calls, min_calls=min_calls)
    correct = get_reward("accuracy")(completions, solutions)
    for score, right, made in zip(scores, correct, calls):
        worked = sum(c["error"] is None for c in made)
        assert score == (1.0 if right == 1.0 and worked >= min_calls else 0.0)
        assert score <= right  # never paid for a wrong answer
