"""format, accuracy (exact / choice / numeric / math), count, jaccard, mra, overlong."""
import threading

import numpy as np
import pytest

from rewards import get_reward

fmt = get_reward("format")
accuracy = get_reward("accuracy")


@pytest.mark.parametrize("text, think, expected", [
    ("<think>a</think><answer>b</answer>", True, 1.0),
    ("  <think>\nmulti\nline\n</think>\n\n<answer>\nb\n</answer>\n", True, 1.0),
    ("<think></think><answer>b</answer>", True, 1.0),  # an empty think block is allowed
    ("<think>a</think><answer> </answer>", True, 0.0),  # an empty answer never is
    ("<answer>b</answer>", True, 0.0),
    ("<think>a</think>text<answer>b</answer>", True, 0.0),
    ("<think>a</think><answer>b</answer> trailing", True, 0.0),
    ("<think>a</think><answer>b</answer><answer>c</answer>", True, 0.0),
    ("<think><answer>x</answer></think><answer>b</answer>", True, 0.0),
    ("<think>a</think><think>b</think><answer>b</answer>", True, 0.0),
    ("<answer>b</answer><think>a</think>", True, 0.0),
    ("<think>a</think><answer>b", True, 0.0),
    ("<answer>b</answer>", False, 1.0),
    ("reasoning aloud <answer>b</answer>", False, 1.0),
    ("reasoning aloud <answer>b</answer> done", False, 0.0),  # text after the answer: nothing
    ("<answer>C</answer>C</answer", False, 0.0),  # the drift: junk to the token limit
    ("<answer>b</answer> \n\t", False, 1.0),  # whitespace after it is no text
    ("<think>a</think><answer>b</answer>", False, 1.0),
    ("<answer>b</answer><answer>c</answer>", False, 0.0),
    ("<answer></answer>", False, 0.0),
    ("</answer>b<answer>", False, 0.0),
])
def test_format(text, think, expected):
    assert fmt([text], [None], think=think) == [expected]


@pytest.mark.parametrize("think", [True, False, "optional", "forbidden"])
@pytest.mark.parametrize("answer", ["<answer>b</answer>", "<think>a</think><answer>b</answer>"])
def test_format_pays_nothing_for_text_after_the_answer_in_every_mode(think, answer):
    clean = fmt([answer], [None], think=think)
    assert fmt([answer + "b</answer"], [None], think=think) == [0.0]
    assert fmt([answer + " more"], [None], think=think) == [0.0]
    # Asked for explicitly, text after the answer scores what the answer alone scores.
    assert fmt([answer + " more"], [None], think=think, text_after=True) == clean


def test_format_text_after_must_be_a_boolean():
    with pytest.raises(ValueError, match="text_after must be true or false"):
        fmt(["<answer>b</answer>"], [None], text_after="yes")


def test_format_think_param_from_yaml_string():
    assert fmt(["<answer>b</answer>"], [None], think="false") == [1.0]


@pytest.mark.parametrize("answer, solution, expected", [
    ("Paris", "paris", 1.0),
    ("  The   Eiffel  tower. ", "the eiffel tower", 1.0),
    ("Paris!", "<answer>Paris</answer>", 1.0),  # R1-V style solution
    ("Lyon", "Paris", 0.0),
    ("", "", 0.0),  # an empty answer never scores
    ("yes", ["no", "Yes"], 1.0),  # a list solution: any of them
])
def test_accuracy_exact(answer, solution, expected):
    assert accuracy([f"<answer>{answer}</answer>"], [solution]) == [expected]


@pytest.mark.parametrize("answer, solution, options, expected", [
    ("B", "B", None, 1.0),
    ("b", "B", None, 1.0),
    ("(B)", "B", None, 1.0),
    ("B. dog", "B", None, 1.0),
    ("The answer is B", "B", None, 1.0),
    ("C", "B", None, 0.0),
    ("A or B", "B", None, 0.0),  # ambiguous answers earn nothing
    ("(A) or (B)", "B", None, 0.0),
    ("A dog", "A", None, 0.0),  # an article, not option A
    ("dog", "B", ["A. cat", "B. dog"], 1.0),  # option text accepted with options
    ("Dog.", "B", ["cat", "dog", "fish"], 1.0),
    ("cat", "B", {"A": "cat", "B": "dog"}, 0.0),
    ("B", "dog", ["A. cat", "B. dog"], 1.0),  # solution given as option text
    ("2", "B", ["1", "2", "3"], 1.0),
])
def test_accuracy_choice(answer, solution, options, expected):
    assert accuracy([f"<answer>{answer}</answer>"], [solution], options=[options]) == [expected]


@pytest.mark.parametrize("answer, solution, expected", [
    ("3", "3", 1.0), ("3.0", "3", 1.0), ("3.0000001", "3", 1.0), ("3.001", "3", 0.0),
    ("The total is 1,024.", "1024", 1.0), ("x = 2, so y = 5", "5", 1.0),
    ("0.5", "1/2", 1.0), ("50%", "0.5", 1.0), ("-0", "0", 1.0), ("1e-7", "0", 1.0),
    ("nan", "1", 0.0), ("inf", "1e999", 0.0), ("9" * 400, "1", 0.0), ("five", "5", 0.0),
])
def test_accuracy_numeric(answer, solution, expected):
    assert accuracy([f"<answer>{answer}</answer>"], [solution]) == [expected]


def test_accuracy_numeric_tolerance_param():
    assert accuracy(["<answer>103</answer>"], ["100"], tol=0.05) == [1.0]
    assert accuracy(["<answer>103</answer>"], ["100"], tol=0.01) == [0.0]


def test_accuracy_math_matches_math_verify():
    from math_verify import parse, verify

    cases = [("$\\frac{1}{2}$", "0.5"), ("\\boxed{2\\sqrt{2}}", "$\\sqrt{8}$"),
             ("$x^2+2x+1$", "$(x+1)^2$"), ("$3$", "$4$"), ("1/3", "0.3333")]
    answers = [f"<answer>{a}</answer>" for a, _ in cases]
    got = accuracy(answers, [g for _, g in cases], mode="math")
    expected = [float(verify(parse(f"${g}$" if "$" not in g else g), parse(a)))
                for a, g in cases]
    assert got == expected == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_accuracy_auto_uses_math_for_latex_solutions():
    assert accuracy(["<answer>0.5</answer>"], ["$\\frac{1}{2}$"]) == [1.0]


def test_accuracy_math_works_in_worker_threads():
    # math-verify's signal-based timeout raises outside the main thread.
    out = []
    worker = threading.Thread(target=lambda: out.extend(
        accuracy(["<answer>$\\frac{2}{4}$</answer>"], ["$\\frac{1}{2}$"], mode="math")))
    worker.start()
    worker.join()
    assert out == [1.0]


def test_accuracy_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        accuracy(["a"], ["a"], mode="fuzzy")


@pytest.mark.parametrize("answer, gold, exact, fuzzy", [
    ("3", "3", 1.0, 1.0), ("There are 3 dogs.", 3, 1.0, 1.0), ("three", "3", 1.0, 1.0),
    ("4", "3", 0.0, 2 / 3), ("0", "0", 1.0, 1.0), ("2", "0", 0.0, 0.0), ("1", "0", 0.0, 0.0),
    ("100", "3", 0.0, 0.0), ("3.5", "3", 0.0, 5 / 6), ("", "3", 0.0, 0.0), ("many", "3", 0.0, 0.0),
])
def test_count(answer, gold, exact, fuzzy):
    text = [f"<answer>{answer}</answer>"]
    assert get_reward("count")(text, [gold]) == [exact]
    assert get_reward("count_fuzzy")(text, [gold]) == [pytest.approx(fuzzy)]


def test_count_non_integer_solution_is_not_applicable():
    assert get_reward("count")(["<answer>3</answer>"], ["three point five"]) == [None]


@pytest.mark.parametrize("answer, gold, expected", [
    ("cat, dog", ["dog", "cat"], 1.0),
    ('["Cat", "DOG"]', "cat; dog", 1.0),
    ("cat\ndog\nbird", ["cat", "dog"], 2 / 3),
    ("cat, dog, bird, fish, cow", ["cat"], 1 / 5),  # listing everything is penalised
    ("horse", ["cat"], 0.0),
    ("[]", [], 1.0),
    ("", [], 0.0),
    ('["cat", "do', ["cat", "dog"], 1 / 3),  # truncated JSON: split as text ("do" != "dog")
])
def test_jaccard(answer, gold, expected):
    got = get_reward("jaccard")([f"<answer>{answer}</answer>"], [gold])
    assert got == [pytest.approx(expected)]


@pytest.mark.parametrize("threshold, expected", [(1.0, [1.0, 0.0, 0.0]), (0.5, [1.0, 1.0, 0.0])])
def test_jaccard_threshold_pays_only_the_set(threshold, expected):
    """threshold: 1/0 instead of partial credit; 1.0 pays the exact set only, so naming one
    shape of two (Jaccard 1/2) earns nothing, as would naming two for one."""
    answers = ["<answer>square, circle</answer>", "<answer>circle</answer>",
               "<answer>triangle</answer>"]
    got = get_reward("jaccard")(answers, ["circle, square"] * 3, threshold=threshold)
    assert got == expected


def _vsi_mra(pred, target):
    """VSI-Bench's own formula, copied: thresholds from linspace, `<=`."""
    num_pts = (0.95 - 0.50) / 0.05 + 2
    thresholds = np.linspace(0.50, 0.95, int(num_pts))
    return float((abs(pred - target) / target <= 1 - thresholds).mean())


@pytest.mark.parametrize("pred, target", [(9, 10), (7, 10), (12.5, 10), (10, 10), (30, 10),
                                          (5.5, 5), (0.3, 0.35), (1000, 1)])
def test_mra_equals_vsi_bench(pred, target):
    got = get_reward("mra")([f"<answer>{pred}</answer>"], [str(target)])[0]
    assert got == pytest.approx(_vsi_mra(pred, target), abs=1e-12)


def test_mra_edge_cases():
    mra = get_reward("mra")
    assert mra(["<answer>0</answer>", "<answer>1</answer>", "<answer>none</answer>",
                "<answer>B</answer>"], ["0", "0", "5", "B"]) == [1.0, 0.0, 0.0, None]


def test_overlong_dapo_shape():
    overlong = get_reward("overlong")
    lengths = [0, 800, 801, 900, 1000, 1001, 5000]
    got = overlong(["x"] * 7, [None] * 7, completion_length=lengths, max_length=1000, cache=200)
    assert got == pytest.approx([0.0, 0.0, -0.005, -0.5, -1.0, -1.0, -1.0])


def test_overlong_defaults_to_field_limit_and_20_percent_buffer():
    overlong = get_reward("overlong")
    got = overlong(["x"] * 3, [None] * 3, completion_length=[80, 90, 50],
                   max_completion_length=[100, 100, None])
    assert got == [0.0, -0.5, None]
    assert overlong(["x"], [None]) == [None]  # no length: not applicable
