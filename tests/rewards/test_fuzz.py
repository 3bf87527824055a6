"""Garbage in, a score out: every reward on >= 10,000 arbitrary completions, never an exception,
always None or a finite float inside the reward's documented range.

Hypothesis draws EXAMPLES batches of BATCH completions (plus solutions, fields and parameters);
each batch goes through every reward, so the ~0.5 ms hypothesis spends per generated string is
paid once, not once per reward: EXAMPLES * BATCH = 10,000 strings reach each reward.
Solutions and fields are garbage too, mixed with valid ones so that the answer parsers run.
REWARDS_FUZZ_EXAMPLES=2000 pytest ... runs a ten times deeper search.
"""
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewards.core as core
from rewards import REWARDS, get_reward

BATCH = 50
EXAMPLES = int(os.environ.get("REWARDS_FUZZ_EXAMPLES", 200))  # 200 * 50 = 10,000 per reward
N_SOLUTIONS, N_FIELD_ROWS = 10, 5  # cycled over the batch: generating them is the slow part

PIECES = ["<answer>", "</answer>", "<think>", "</think>", "<answer><answer>", "</answer></answer>",
          "[", "]", "{", "}", "(", ")", ",", ", ", ";", "\n", " to ", "-", ":", "%", "/", "$", "\\",
          "nan", "NaN", "inf", "-inf", "1e999", "-1e999", "1e-320", "-0", "0", "3.5", "1,000",
          "9" * 400, "1" + "0" * 5000, "0." + "0" * 300 + "1", "A", "B.", "(C)", "the answer is D",
          '"bbox_2d": [', '"label": "', '{"bbox_2d": [0, 0, 10, 10], "label": "x"}', "[1, 2, 3, 4]",
          "(1,2),(3,4)", "[10, 20", "1:00:00", "5.5s", "\\frac{1}{2}", "\\boxed{", "x^2", "{{{{",
          "[" * 50, "🐈", "猫", "\x00", "\u202e", "\ud7ff", " " * 30, "```json\n", "three",
          "none"]
# NaN and infinities included; no subnormals: tests/conftest.py flushes them to zero (and the
# string "1e-320" above still reaches the parsers).
FLOATS = st.floats(allow_subnormal=False)
pieces = st.sampled_from(PIECES)
garbage_text = st.one_of(st.text(max_size=30), st.lists(pieces, max_size=6).map("".join),
                         st.lists(st.one_of(pieces, st.text(max_size=4), FLOATS.map(repr)),
                                  max_size=6).map("".join))
completion = st.one_of(garbage_text,
                       garbage_text.map(lambda t: f"<think>x</think><answer>{t}</answer>"))

number = st.one_of(st.integers(-10**30, 10**30), FLOATS, st.integers(-5, 50))
garbage_value = st.one_of(st.none(), garbage_text, number, st.booleans(),
                          st.lists(st.one_of(number, garbage_text), max_size=5),
                          st.dictionaries(garbage_text, number, max_size=3))
box = st.lists(st.floats(-50, 2000, allow_subnormal=False), min_size=4, max_size=4)
segment = st.lists(st.floats(0, 500, allow_subnormal=False), min_size=2, max_size=2)
solution = st.one_of(
    garbage_value, box, segment, st.lists(box, max_size=3), st.integers(0, 20),
    st.sampled_from(["A", "B", "paris", "3", "1/2", "$\\frac{1}{2}$", "cat, dog", "[]", "0 to 10"]),
    st.lists(st.fixed_dictionaries({"bbox_2d": box, "label": st.sampled_from(["a", "b"])}),
             max_size=3),
    st.lists(st.sampled_from(["cat", "dog", "x"]), max_size=3))
size = st.one_of(st.none(), st.lists(number, min_size=2, max_size=2), garbage_value,
                 st.sampled_from([[640, 480], [1, 1], [0, 10], "640x480"]),
                 st.fixed_dictionaries({"width": number, "height": number}))
fields_row = st.fixed_dictionaries({
    "image_size": size, "resized_size": size, "duration": st.one_of(number, garbage_value),
    "options": st.one_of(st.none(), st.lists(garbage_text, max_size=5), garbage_value),
    "completion_length": st.one_of(number, garbage_value),
    "max_completion_length": st.one_of(number, garbage_value),
    "task": st.one_of(st.none(), st.sampled_from(["a", "b"])),
    "calls": st.one_of(garbage_value, st.lists(st.fixed_dictionaries(
        {"name": garbage_text, "error": st.one_of(st.none(), garbage_value)}), max_size=3)),
})
PARAMS = {
    "format": st.fixed_dictionaries({"think": st.sampled_from([True, False, "optional",
                                                               "forbidden"]),
                                      "text_after": st.booleans()}),
    "accuracy": st.fixed_dictionaries({
        "mode": st.sampled_from(["auto", "exact", "choice", "numeric"]),
        "tol": st.sampled_from([1e-6, 0.0, 0.1, 1e300])}),
    "iou": st.fixed_dictionaries({
        "coords": st.sampled_from(["absolute", "norm1000", "resized", "norm1"]),
        "threshold": st.sampled_from([None, 0.5, 0.0, 1.0])}),
    "giou": st.fixed_dictionaries({"coords": st.sampled_from(["absolute", "norm1000", "resized"])}),
    "detection": st.fixed_dictionaries({"threshold": st.sampled_from([0.5, 0.0]),
                                        "use_labels": st.booleans(),
                                        "coords": st.sampled_from(["absolute", "norm1000"])}),
    "wer": st.fixed_dictionaries({"normalize": st.booleans()}),
    "cer": st.fixed_dictionaries({"normalize": st.booleans()}),
    "overlong": st.fixed_dictionaries({"max_length": st.one_of(st.none(), number),
                                       "cache": st.one_of(st.none(), number)}),
    "tiou": st.fixed_dictionaries({"tasks": st.sampled_from([None, ["a"]])}),
}
SCORED = {name: 0 for name in REWARDS.names()}


def _check(name, completions, solutions, fields, params):
    # strict: a reward bug must raise here, not hide behind the production fallback to 0.0.
    scores = get_reward(name)(completions, solutions, **fields, **params, strict=True)
    low, high = REWARDS.score_range(name)
    assert len(scores) == len(completions)
    for score in scores:
        assert score is None or (type(score) is float and math.isfinite(score)
                                 and low <= score <= high), (name, params, score)
    SCORED[name] += len(completions)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(completions=st.lists(completion, min_size=BATCH, max_size=BATCH),
       solutions=st.lists(solution, min_size=N_SOLUTIONS, max_size=N_SOLUTIONS),
       rows=st.lists(fields_row, min_size=N_FIELD_ROWS, max_size=N_FIELD_ROWS),
       params=st.fixed_dictionaries(PARAMS))
def test_every_reward_survives_garbage(completions, solutions, rows, params):
    batch_solutions = [solutions[i % N_SOLUTIONS] for i in range(BATCH)]
    fields = {key: [rows[i % N_FIELD_ROWS][key] for i in range(BATCH)] for key in rows[0]}
    for name in REWARDS.names():
        _check(name, completions, batch_solutions, fields, params.get(name, {}))


@FUZZ
@given(completions=st.lists(completion, min_size=BATCH, max_size=BATCH),
       tails=st.lists(garbage_text.filter(lambda t: t.strip() and "answer>" not in t),
                      min_size=BATCH, max_size=BATCH),
       think=st.sampled_from([True, False, "optional", "forbidden"]))
def test_format_never_pays_for_text_after_the_answer(completions, tails, think):
    # Whatever precedes it, a completion with text after its closing answer tag scores 0 unless
    # text_after is asked for; asked for, it scores what the text up to the tag scores.
    fmt = get_reward("format")
    texts = [c + "</answer>" + t for c, t in zip(completions, tails)]
    assert fmt(texts, [None] * BATCH, think=think, strict=True) == [0.0] * BATCH
    heads = [c + "</answer>" for c in completions]
    assert (fmt(texts, [None] * BATCH, think=think, text_after=True, strict=True)
            == fmt(heads, [None] * BATCH, think=think, strict=True))


@settings(FUZZ, max_examples=max(EXAMPLES // 20, 1))
@given(completions=st.lists(completion, min_size=BATCH, max_size=BATCH),
       solutions=st.lists(solution, min_size=BATCH, max_size=BATCH))
def test_accuracy_math_mode_survives_garbage(completions, solutions):
    # math-verify parses with sympy (1-10 ms a string): 500 strings, separately.
    _check("accuracy", completions, solutions, {}, {"mode": "math"})


def test_fuzz_budget_reached_every_reward():
    # Runs after the fuzz test above (file order): each reward saw EXAMPLES * BATCH strings.
    if SCORED["format"] == 0:
        pytest.skip("run together with test_every_reward_survives_garbage")
    assert all(count >= min(EXAMPLES * BATCH, 10_000) for count in SCORED.values()), SCORED
