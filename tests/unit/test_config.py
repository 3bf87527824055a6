"""Config loading: deltas, overrides, presets, and errors that name the key."""
from pathlib import Path

import pytest

from mmrl import config
from mmrl.cli import validate

RECIPE_DIR = Path(__file__).parents[2] / "recipes"
RECIPES = sorted(p for p in RECIPE_DIR.rglob("*.yaml") if p.name not in ("tiny.yaml", "learn.yaml"))
TINY = sorted(RECIPE_DIR.rglob("tiny.yaml"))


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_deltas_and_overrides(tmp_path):
    p = _write(tmp_path, "data: {train: x.jsonl}\ntrain: {lr: 1.0e-4}\n"
                         "rewards: [{name: accuracy}, {name: format, weight: 0.5}]\n")
    cfg = config.load(p, ["train.steps=7", "rewards.1.weight=0.25", "train.lr=3e-5"])
    assert cfg.train.steps == 7 and cfg.train.lr == pytest.approx(3e-5)
    assert [(r.name, r.weight) for r in cfg.rewards] == [("accuracy", 1.0), ("format", 0.25)]
    assert cfg.rollout.num_generations == 8  # untouched default
    assert cfg.name == "c"


@pytest.mark.parametrize("override, needle", [
    ("train.lrr=1", "train.lrr"),
    ("train.steps=abc", "train.steps"),
    ("rewards.0.wieght=1", "rewards[0].wieght"),
    ("nosuch.key=1", "nosuch"),
    ("algo.preset=ppo2", "algo.preset"),
])
def test_errors_name_the_key(tmp_path, override, needle):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with pytest.raises(config.ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        config.load(p, [override])


def test_missing_required_key(tmp_path):
    with pytest.raises(config.ConfigError, match="data.train"):
        config.load(_write(tmp_path, "rewards: [{name: accuracy}]\n"))


def test_preset_fills_only_unset_keys(tmp_path):
    p = _write(tmp_path, "data: {train: x}\nalgo: {preset: dapo, clip_high: 0.3}\n")
    cfg = config.load(p, ["algo.dynamic_sampling=false"])
    assert cfg.algo.agg == "token_mean" and cfg.algo.overlong_filter is True  # from the preset
    assert cfg.algo.clip_high == 0.3  # YAML wins over the preset
    assert cfg.algo.dynamic_sampling is False  # command line wins over the preset
    gspo = config.load(p, ["algo.preset=gspo", "algo.clip_high=4e-4"])
    assert gspo.algo.ratio == "sequence" and gspo.algo.clip_low == pytest.approx(3e-4)


def test_resolved_config_round_trips(tmp_path):
    p = _write(tmp_path, "data: {train: x}\nrewards: [{name: iou, params: {threshold: 0.5}}]\n")
    cfg = config.load(p)
    config.save(cfg, tmp_path / "run" / "config.yaml")
    again = config.load(tmp_path / "run" / "config.yaml")
    assert again == cfg


def test_validate_reports_every_problem(tmp_path):
    p = _write(tmp_path, "data: {train: missing.jsonl}\nmodel: {family: nope}\n"
                         "algo: {advantage: nope}\n"
                         "rewards: [{name: accuracy, params: {bogus: 1}}, {name: nosuch}]\n")
    problems = validate(config.load(p))
    text = "\n".join(problems)
    for needle in ("model.family", "algo.advantage", "bogus", "nosuch"):
        assert needle in text, text


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.name if p.parent.name == "recipes"
                                                            else p.parent.name))
def test_every_recipe_validates(recipe):
    cfg = config.load(recipe)
    assert validate(cfg) == []


@pytest.mark.parametrize("tiny", TINY, ids=lambda p: p.parent.name)
def test_every_recipe_tiny_layer_validates(tiny):
    """config.yaml + tiny.yaml (the CI smoke run) resolves too, and really is tiny."""
    cfg = config.load(tiny.with_name("config.yaml"), [str(tiny)])
    assert validate(cfg) == []
    assert cfg.model.path == "tiny" and cfg.data.generate and cfg.train.steps <= 2


def test_every_recipe_has_launch_command_and_readme():
    for recipe in RECIPES:
        first = recipe.read_text().splitlines()[0]
        assert first.startswith("# ") and ("mmrl train" in first or "scripts/train.sh" in first)
        if recipe.parent != RECIPE_DIR:
            readme = (recipe.parent / "README.md").read_text()
            assert "scripts/train.sh 8" in readme and "## Data" in readme
