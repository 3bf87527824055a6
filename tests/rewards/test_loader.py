"""One "pkg.mod:attr" loader for mmrl (mmrl/loader.py, which algos may import), and the copy
rewards/ keeps because it imports nothing from mmrl: both load the same objects and fail alike,
and every registry's escape hatch goes through them."""
import pytest

import mmrl.loader
import rewards.registry
from mmrl.algos import get_advantage
from mmrl.data.schema import FORMATS
from rewards import get_reward

LOADERS = [mmrl.loader.load, rewards.registry.load]


@pytest.mark.parametrize("load", LOADERS)
def test_load_imports_the_named_attribute(load):
    import json.decoder

    assert load("json.decoder:JSONDecoder", "thing") is json.decoder.JSONDecoder


@pytest.mark.parametrize("path,why", [
    ("no_such_pkg_xyz.mod:fn", "No module named 'no_such_pkg_xyz'"),
    ("json:no_such_fn", "has no attribute 'no_such_fn'")])
def test_both_loaders_fail_alike_naming_the_kind_and_the_path(path, why):
    messages = []
    for load in LOADERS:
        with pytest.raises(KeyError) as e:
            load(path, "advantage")
        messages.append(e.value.args[0])
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"advantage {path!r}: cannot import") and why in messages[0]


def test_every_escape_hatch_goes_through_a_loader():
    import math

    assert get_advantage("math:sqrt") is math.sqrt  # algos
    assert FORMATS.get("math:sqrt") is math.sqrt  # mmrl.registry
    assert get_reward("math:sqrt") is math.sqrt  # rewards
    with pytest.raises(KeyError, match="^\"data format 'math:nope': cannot import"):
        FORMATS.get("math:nope")
