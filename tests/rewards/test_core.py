"""The reward contract: registry, signatures, answer extraction, combine, None handling, CLI."""
import functools
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rewards
from rewards import REWARDS, combine, extract_answer, get_reward
from rewards.core import find_numbers, to_float

EXPECTED = {"format", "accuracy", "iou", "giou", "detection", "count", "count_fuzzy", "jaccard",
            "tiou", "tiou_v2", "bleu", "wer", "cer", "rouge_l", "mra", "overlong"}
FIELD_NAMES = {"task", "image_size", "resized_size", "duration", "options", "completion_length",
               "max_completion_length"}
REPO = Path(__file__).resolve().parents[2]


def test_every_issue_reward_is_registered():
    assert EXPECTED <= set(REWARDS.names())
    for name in EXPECTED:
        assert get_reward(name) is REWARDS[name] and name in REWARDS


def test_unknown_reward_names_the_known_ones():
    with pytest.raises(KeyError, match="iou"):
        get_reward("nope")


def test_registry_rejects_a_second_function_under_a_taken_name():
    registry = rewards.RewardRegistry()

    def first(completions, solution, **fields):
        return [1.0] * len(completions)

    def second(completions, solution, **fields):
        return [0.0] * len(completions)

    registry.register("mine", low=0.0, high=1.0)(first)
    registry.register("mine")(first)  # the same function again is fine
    with pytest.raises(KeyError, match="already registered"):
        registry.register("mine")(second)
    assert registry.names() == ["mine"] and registry.score_range("mine") == (0.0, 1.0)


def test_escape_hatch_imports_user_rewards():
    assert get_reward("rewards.counting:count") is rewards.counting.count


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_is_plain_and_params_are_keyword_only(name):
    fn = get_reward(name)
    assert inspect.isfunction(fn)
    params = inspect.signature(fn).parameters
    assert list(params)[:2] == ["completions", "solution"]
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    bindable = REWARDS.params(name)
    assert not bindable.keys() & FIELD_NAMES, "params must not shadow per-sample field names"
    assert inspect.getdoc(fn) and ">>>" in fn.__doc__, "every reward has a doctest"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unknown_fields_are_ignored_and_lengths_match(name):
    fn = get_reward(name)
    out = fn(["<answer>x</answer>", "y"], ["x", "y"], something_else=[1, 2], task=["a", "b"],
             image_size=[[10, 10], None], completion_length=[3, 4])
    assert len(out) == 2
    assert all(s is None or isinstance(s, float) for s in out)


def test_partial_binding_like_the_trainer():
    fn = functools.partial(get_reward("iou"), threshold=0.5)
    assert fn(["<answer>[0, 0, 10, 10]</answer>", "<answer>[6, 0, 16, 10]</answer>"],
              [[0, 0, 10, 10]] * 2) == [1.0, 0.0]


def test_tasks_param_makes_other_tasks_not_applicable():
    out = get_reward("count")(["<answer>3</answer>"] * 2, ["3", "3"], task=["counting", "vqa"],
                              tasks=["counting"])
    assert out == [1.0, None]


def test_numpy_and_torch_values_are_accepted():
    import numpy as np
    import torch

    assert get_reward("iou")(["<answer>[0, 0, 0.5, 0.5]</answer>"], [np.array([0, 0, 10, 10])],
                             image_size=[np.array([20, 20])], coords="norm1") == [1.0]
    assert get_reward("count")(["<answer>3</answer>"] * 2, [np.int64(3), torch.tensor(3)]) == \
        [1.0, 1.0]
    assert get_reward("tiou_v2")(["<answer>0 to 10</answer>"], [np.array([0.0, 10.0])],
                                 duration=[np.float32(100)]) == [1.0]


def test_none_solution_is_not_applicable():
    assert get_reward("accuracy")(["<answer>a</answer>"] * 2, ["a", None]) == [1.0, None]


@pytest.mark.parametrize("text, expected", [
    ("<answer>42</answer>", "42"),
    ("<think>x</think>\n<answer>\n B \n</answer>", "B"),
    ("<answer>1</answer><answer>2</answer>", "2"),
    ("<answer>1</answer><answer>2", "1"),  # an unclosed trailing block is not a block
    ("no tags at all  ", "no tags at all"),
    ("<answer></answer>", ""),
    ("<answer>a<answer>b</answer>", "a<answer>b"),  # as re.findall(r"<answer>(.*?)</answer>")
    (None, ""),
    ([{"role": "assistant", "content": "<answer>7</answer>"}], "7"),  # TRL conversational
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_is_linear_on_adversarial_input():
    import time

    text = "<answer>" * 200_000 + "x"
    start = time.perf_counter()
    assert extract_answer(text) == ""  # opened, never closed: no answer
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text", [
    "<answer>circle, trian>sirc, square, s tri",      # cut at the token budget
    "<answerivle, square, sriangle,ale</answer>circle",  # opening tag broken in sampling
    "circle, square</answer>",                          # closing tag with no opening one
])
def test_an_answer_block_that_never_closes_is_no_answer(text):
    from rewards import get_reward
    assert extract_answer(text) == ""
    assert get_reward("jaccard")([text], ["square, triangle"]) == [0.0]


def test_plain_answers_without_tags_still_count():  # the anchors' fallback
    assert extract_answer(" square, triangle ") == "square, triangle"


def test_numbers():
    assert to_float("1,024") == 1024 and to_float("3/4") == 0.75 and to_float("50%") == 0.5
    assert to_float("nan") is None and to_float("inf") is None and to_float("1e999") is None
    assert to_float(True) is None and to_float(10**400) is None
    assert find_numbers("[100,200,300,400]") == [100, 200, 300, 400]
    assert find_numbers("x=-3.5e2 and 9" + "9" * 400) == [-350.0]  # overflow dropped


def test_combine_weights_and_none():
    scores = {"accuracy": [1.0, 0.0, None, 1.0], "format": [1.0, 1.0, 1.0, None]}
    assert combine(scores, {"accuracy": 1.0, "format": 0.5}) == [1.5, 0.5, 0.5, 1.0]
    assert combine({"a": [0.5]}, {}) == [0.5]  # missing weight: 1.0
    with pytest.raises(ValueError):
        combine({"a": [1.0], "b": [1.0, 2.0]}, {})


def test_strict_off_turns_a_crash_into_zero():
    import warnings

    import rewards.core as core

    def broken(text, solution):
        raise RuntimeError("bug")

    with pytest.warns(RuntimeWarning, match="reward broken failed"):
        assert core.score_batch(broken, ["a"], ["b"], {}) == [0.0]
    with pytest.raises(RuntimeError, match="bug"):
        core.score_batch(broken, ["a"], ["b"], {"strict": True})
    with pytest.raises(ValueError, match="non-finite"):
        core.score_batch(lambda t, s: float("nan"), ["a"], ["b"], {"strict": True})
    # The caller's set, not module state, decides whether a failing reward warns again.
    warned: set[str] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert core.score_batch(broken, ["a", "b"], ["b", "c"], {"warned": warned}) == [0.0, 0.0]
    assert len(caught) == 1 and warned == {"broken"}
    with pytest.warns(RuntimeWarning):  # a fresh set (a new run) warns again
        core.score_batch(broken, ["a"], ["b"], {"warned": set()})


def test_overlong_stays_in_its_range_at_the_limit():
    """Found by the fuzz test: ((3 - 0.95) - 3) / 0.95 is -1.0000000000000002 in floats."""
    from rewards import get_reward

    scores = get_reward("overlong")(["", ""], None, completion_length=[3, 2], max_length=3,
                                    cache=0.95, strict=True)
    assert scores == [-1.0, 0.0]  # 2 <= 3 - 0.95: no penalty


def test_call_options_are_not_sample_fields():
    from rewards import get_reward

    args = (["<answer>[0, 0, 10, 10]</answer>", "<answer>[5, 0, 15, 10]</answer>"],
            [[0, 0, 10, 10], [0, 0, 10, 10]])
    assert get_reward("iou")(*args, strict=True, warned=set()) == [1.0, 1 / 3]


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "rewards", *args], input=stdin, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_score_and_ls(tmp_path):
    lines = [{"completion": "<answer>[0, 0, 10, 10]</answer>", "solution": [0, 0, 10, 10]},
             {"completion": "<answer>[5, 0, 15, 10]</answer>", "solution": [0, 0, 10, 10]},
             {"completion": "<answer>[0, 0, 500, 500]</answer>", "solution": [0, 0, 10, 10],
              "task": "other"},
             {"completion": "oops", "solution": "no box here"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = _cli("score", "--reward", "iou", "--param", "threshold=0.3", "--input", str(path))
    assert result.returncode == 0, result.stderr
    assert [json.loads(x) for x in result.stdout.splitlines()] == [
        {"score": 1.0}, {"score": 1.0}, {"score": 0.0}, {"score": None}]

    result = _cli("score", "--reward", "accuracy", "--param", "mode=exact", "--input", "-",
                  stdin=json.dumps({"completion": "<answer>Paris</answer>", "solution": "paris"}))
    assert result.stdout.strip() == '{"score": 1.0}'

    listing = _cli("ls")
    assert listing.returncode == 0
    names = [line.split()[0] for line in listing.stdout.splitlines()]
    assert EXPECTED <= set(names)
    assert "IoU" in next(line for line in listing.stdout.splitlines() if line.startswith("iou "))


def test_cli_rejects_unknown_params_and_rewards(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"completion": "a", "solution": "a"}\n')
    bad_param = _cli("score", "--reward", "iou", "--param", "treshold=0.5", "--input", str(path))
    assert bad_param.returncode != 0 and "threshold" in bad_param.stderr
    bad_name = _cli("score", "--reward", "nope", "--input", str(path))
    assert bad_name.returncode != 0 and "unknown reward" in bad_name.stderr
