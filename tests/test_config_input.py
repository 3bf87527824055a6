"""Bad config input gets one clear, short line: non-UTF-8 or broken YAML named by file and line,
values no option can mean (inf, NaN, a negative seed) refused, an int for a float key accepted
without a warning, and a huge value never echoed whole."""
from __future__ import annotations

import warnings

import pytest

from mmrl import config
from mmrl.cli import main


def test_non_utf8_config_names_file_line_and_byte(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"data:\n  train: x.jsonl\nname: caf\xe9\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}:3: not UTF-8 text (byte 0xe9 at column 10); save the file "
                            f"as UTF-8")


def test_broken_yaml_is_named(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("data: {train: x.jsonl\n")
    with pytest.raises(config.ConfigError, match=r"recipe.yaml: not valid YAML: "):
        config.load(path)


@pytest.mark.parametrize("override, says", [
    ("train.lr=inf", "train.lr=inf: must be a finite number"),
    ("algo.beta=.nan", "algo.beta=nan: must be a finite number"),
    ("train.seed=-1", "train.seed=-1: must be in [0, 2**32)"),
    ("train.seed=4294967296", "train.seed=4294967296: must be in [0, 2**32)"),
])
def test_values_no_option_can_mean_are_refused(override, says):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, ["data.train=x.jsonl", override])
    assert str(e.value).startswith(f"override {override}: {says}"), str(e.value)


def test_int_for_a_float_key_is_taken_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # OmegaConf's FutureWarning printed 2 lines per command
        cfg = config.load(None, ["data.train=x.jsonl", "algo.beta=0", "train.betas.0=0"])
    assert cfg.algo.beta == 0.0 and isinstance(cfg.algo.beta, float)
    assert cfg.train.betas == [0.0, 0.99]


def test_a_huge_value_is_not_echoed_whole(tmp_path):
    huge = "x" * 10_000_000
    with pytest.raises(config.ConfigError) as e:
        config.load(None, ["data.train=x.jsonl", f"train.lr={huge}"])
    assert len(str(e.value)) < 2000 and "(100000" in str(e.value)
    path = tmp_path / "r.yaml"
    path.write_text("data: {train: x.jsonl}\n")
    with pytest.raises(SystemExit) as stop:  # what the terminal shows
        main(["train", str(path), f"train.lr={huge}"])
    assert len(str(stop.value.code)) < 2000
    with pytest.raises(SystemExit) as stop:
        main(["validate", str(path), f"train.seed={huge}"])
    assert len(str(stop.value.code)) < 2000
