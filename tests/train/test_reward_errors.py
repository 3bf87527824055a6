"""A custom reward that fails is named with what failed: the reward, the sample (id and
file:line), the exception's type and message, or what it returned instead of a list; a
"module:fn" that does not import says whether the current folder is on Python's path."""
from __future__ import annotations

import sys

import pytest

from mmrl.config import RewardSpec
from mmrl.train.scoring import RewardError, RewardSet, bind_reward, rewards_at
from mmrl.types import Sample

USER_REWARDS = '''
def by_difficulty(completions, solution, difficulty, **fields):
    return [1.0 / d["level"] for d in difficulty]
def one_float(completions, solution, **fields):
    return 0.5
def lazy(completions, solution, **fields):
    return (len(c) / 10 for c in completions)
'''


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    (tmp_path / "ops_user_rewards.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ops_user_rewards"
    sys.modules.pop("ops_user_rewards", None)


def _samples() -> list[Sample]:
    return [Sample(id=f"s{i}", messages=[], solution="1", source=f"data/train.jsonl:{i + 1}",
                   fields={"difficulty": d}) for i, d in enumerate([{"level": 2}, {}, {"level": 1}])]


def test_a_raising_reward_names_itself_the_sample_and_the_error(user_module):
    rs = RewardSet([RewardSpec(name=f"{user_module}:by_difficulty")])
    with pytest.raises(RewardError) as e, rewards_at("step 7"):
        rs.score(_samples(), ["a", "b", "c"])
    assert str(e.value) == ("step 7: reward 'by_difficulty' raised KeyError: 'level' on sample s1 "
                            "(data/train.jsonl:2); fix the reward or the record (--debug shows "
                            "the traceback)")
    assert isinstance(e.value.__cause__, KeyError)  # the traceback under --debug is the reward's


@pytest.mark.parametrize("name, says", [
    ("one_float", "reward 'one_float' returned 0.5 (float), not a list: a reward scores a batch "
                  "and returns one number (or None) per completion, 3 here (first sample s0 "
                  "(data/train.jsonl:1))"),
    ("lazy", "reward 'lazy' returned a generator, not a list of 3 scores; return a list (e.g. "
             "wrap it in list(...)) (first sample s0 (data/train.jsonl:1))"),
])
def test_a_reward_returning_no_list_is_named(user_module, name, says):
    rs = RewardSet([RewardSpec(name=f"{user_module}:{name}")])
    with pytest.raises(RewardError) as e:
        rs.score(_samples(), ["a", "b", "c"])
    assert str(e.value).startswith(says)


def test_module_beside_the_config_off_the_path_gets_a_hint(tmp_path, monkeypatch):
    (tmp_path / "myrew.py").write_text("def fn(completions, solution, **f):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)
    here = {"", ".", str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])  # as `mmrl` runs
    with pytest.raises(KeyError) as e:
        bind_reward(RewardSpec(name="myrew:fn"))
    msg = e.value.args[0]
    assert f"the current folder {tmp_path}, which holds myrew.py, is not on Python's import " \
           f"path: run `PYTHONPATH=. mmrl train ...`" in msg
    monkeypatch.syspath_prepend(str(tmp_path))  # now it imports
    assert bind_reward(RewardSpec(name="myrew:fn"))(["x"], ["1"]) == [1.0]
    sys.modules.pop("myrew", None)
    with pytest.raises(KeyError) as e:
        bind_reward(RewardSpec(name="notthere:fn"))
    assert f"the current folder {tmp_path} is on the import path but holds no notthere.py" \
           in e.value.args[0]
