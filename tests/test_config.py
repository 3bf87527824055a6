"""Config loading: deltas, overrides, presets, and errors that name the key."""
import warnings
from pathlib import Path

import pytest

from mmrl import config
from mmrl import algos, cli, config_rules
from mmrl.validate import validate

RECIPE_DIR = Path(__file__).parents[1] / "recipes"
RECIPES = sorted([*RECIPE_DIR.glob("*.yaml"), *RECIPE_DIR.glob("*/config.yaml")])
TINY = sorted(RECIPE_DIR.rglob("tiny.yaml"))
# User layers over a recipe's config.yaml (e.g. video_qa/long.yaml), for the processes they name.
LAYERS = sorted(p for p in RECIPE_DIR.glob("*/*.yaml") if p.name not in ("config.yaml", "tiny.yaml"))


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
def test_errors_name_the_override_and_the_key(tmp_path, override, needle):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with pytest.raises(config.ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")) as e:
        config.load(p, [override])
    assert str(e.value).startswith(f"override {override}: "), str(e.value)


def test_an_error_in_a_layer_names_that_layer(tmp_path):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    layer = tmp_path / "tiny.yaml"
    layer.write_text("train: {lrr: 1}\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(p, ["train.steps=3", str(layer)])
    assert str(e.value).startswith(f"{layer}: Key 'lrr' not in 'TrainConfig'"), str(e.value)


def test_an_integer_override_of_a_float_key_is_a_float_without_a_warning(tmp_path):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # OmegaConf's FutureWarning on implicit int -> float
        cfg = config.load(p, ["train.lr=1", "rollout.temperature=1", "eval.max_new_tokens=5"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert isinstance(cfg.rollout.temperature, float) and cfg.eval.max_new_tokens == 5


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


@pytest.mark.parametrize("layer", LAYERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recipe_layer_validates_for_its_process_count(layer, monkeypatch):
    first = layer.read_text().splitlines()[0]
    launch = first.split("scripts/train.sh ", 1)[1].split()
    assert launch[1:] == [f"recipes/{layer.parent.name}/config.yaml", f"recipes/{layer.parent.name}/{layer.name}"]
    monkeypatch.setenv("WORLD_SIZE", launch[0])
    cfg = config.load(layer.with_name("config.yaml"), [str(layer)])
    assert validate(cfg, world=int(launch[0])) == []


def test_every_recipe_has_launch_command_and_readme():
    for recipe in RECIPES:
        first = recipe.read_text().splitlines()[0]
        assert first.startswith("# ") and ("mmrl train" in first or "scripts/train.sh" in first)
        if recipe.parent != RECIPE_DIR:
            readme = (recipe.parent / "README.md").read_text()
            assert "scripts/train.sh 8" in readme and "## Data" in readme


def test_recipe_folders_hold_only_what_users_run():
    """config.yaml (the GPU run), tiny.yaml (the CI smoke layer), README.md, and user layers
    whose launch line the README shows (e.g. video_qa/long.yaml): the learning table's layers
    are research and live in research/layers/."""
    def user_layer(p):
        readme = p.with_name("README.md")
        return p in LAYERS and readme.is_file() and f"recipes/{p.parent.name}/{p.name}" in readme.read_text()

    extra = [str(p.relative_to(RECIPE_DIR)) for d in RECIPE_DIR.iterdir() if d.is_dir()
             for p in d.iterdir()
             if p.name not in ("config.yaml", "tiny.yaml", "README.md") and not user_layer(p)]
    assert not extra, f"not a user file of a recipe: {extra}"


# issue #12 case 6: bad numbers fail at load (and so in `mmrl validate` and `mmrl train`) with one
# line naming the key and its legal range.
BAD_NUMBERS = [
    (["rollout.num_generations=1"], "rollout.num_generations=1: must be >= 2 with algo.advantage=grpo"),
    (["rollout.num_generations=1", "algo.advantage=rloo"],
     "rollout.num_generations=1: must be >= 2 with algo.advantage=rloo"),
    (["rollout.num_generations=0", "algo.advantage=pkg.mod:fn"], "rollout.num_generations=0: must be >= 1"),
    (["rollout.prompts_per_step=0"], "rollout.prompts_per_step=0: must be >= 1"),
    (["rollout.max_new_tokens=0"], "rollout.max_new_tokens=0: must be >= 1"),
    (["rollout.temperature=0"], "rollout.temperature=0.0: must be > 0"),
    (["rollout.top_p=0"], "rollout.top_p=0.0: must be in (0, 1]"),
    (["rollout.top_p=1.5"], "rollout.top_p=1.5: must be in (0, 1]"),
    (["train.lr=-1e-6"], "train.lr=-1e-06: must be > 0"),
    (["train.lr=0"], "train.lr=0.0: must be > 0"),
    (["algo.clip_low=1.0"], "algo.clip_low=1.0: must be in [0, 1)"),
    (["algo.clip_high=-0.1"], "algo.clip_high=-0.1: must be in [0, 1)"),
    (["algo.preset=cispo", "algo.loss_type=ppo"], "algo.clip_low=1.0: must be in [0, 1) or 1.0 with algo.loss_type=cispo"),
    (["rollout.num_generations=1", "algo.preset=gpg"], "rollout.num_generations=1: must be >= 2 with algo.advantage=gpg"),
    (["algo.dual_clip=0.5"], "algo.dual_clip=0.5: must be > 1 or null"),
    (["algo.num_iterations=0"], "algo.num_iterations=0: must be >= 1"),
    (["train.micro_batch_size=0"], "train.micro_batch_size=0: must be >= 1"),
    (["sft.stop_checks=0"], "sft.stop_checks=0: must be >= 1"),
    (["data.video_nframes=8"], "data.video_fps=2.0 and data.video_nframes=8: set one of them to null"),
    (["rollout.backend=vllm", "rollout.vllm.weight_transfer=nccl"],
     "rollout.vllm.weight_transfer=nccl: must be one of auto|bytes|direct with vLLM colocated"),
]


def _culprit(p, overrides: list[str], message: str) -> str:
    """The overrides whose keys the message names (as typed), else the YAML file."""
    named = [o for o in overrides if f"{o.split('=')[0]}=" in message]
    return f"override {', '.join(named)}" if named else str(p)


@pytest.mark.parametrize("overrides, message", BAD_NUMBERS, ids=lambda x: str(x))
def test_bad_numbers_fail_at_load_with_one_line_naming_the_override(tmp_path, overrides, message):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(p, overrides)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{_culprit(p, overrides, message)}: {message}"), str(e.value)


@pytest.mark.parametrize("overrides, message", BAD_NUMBERS[:3] + BAD_NUMBERS[-2:],
                         ids=lambda x: str(x))
def test_bad_numbers_fail_mmrl_validate(tmp_path, capsys, overrides, message):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", str(p), *overrides])
    assert str(e.value).startswith(f"config error: {_culprit(p, overrides, message)}: {message}"), \
        str(e.value)
    assert "\n" not in str(e.value)


def test_every_problem_is_listed_and_check_counts_the_rest(tmp_path):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    cfg = config.load(p)
    cfg.train.lr, cfg.rollout.temperature = 0.0, 0.0
    assert validate(cfg) == ["rollout.temperature=0.0: must be > 0", "train.lr=0.0: must be > 0"]
    with pytest.raises(config.ConfigError, match=r"^rollout.temperature=0.0: must be > 0 \(and 1 more"):
        config.check(cfg)


def test_prompts_per_step_divisible_by_process_count(tmp_path, monkeypatch):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n"
                         "rollout: {prompts_per_step: 6}\n")
    assert config.load(p).rollout.prompts_per_step == 6
    assert validate(config.load(p), world=4) == [
        "rollout.prompts_per_step=6: must be divisible by the process count 4"]
    monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun / accelerate: known at load
    with pytest.raises(config.ConfigError, match="divisible by the process count 4"):
        config.load(p)


@pytest.mark.parametrize("override, legal", [
    ("algo.agg=mean", "token_mean"), ("algo.kl=k4", "k3"), ("algo.ratio=seq", "sequence"),
    ("rollout.backend=sglang", "vllm"), ("train.parallel=zero3", "fsdp2"),
    ("model.dtype=fp16", "bfloat16"), ("model.attn_implementation=flash", "sdpa"),
    ("data.on_bad_sample=ignore", "skip"), ("data.audio_truncate=tail", "head"),
    ("train.lr_schedule=step", "cosine"), ("log.progress=quiet", "lines"),
    ("rollout.vllm.weight_transfer=ftp", "nccl"),
    ("algo.loss_type=ppo2", "cispo"), ("algo.tis_level=seq", "geometric"),
    ("algo.tis_mode=clip", "mask"), ("algo.scale_rewards=std", "batch"), ("algo.kl_reward_kind=k5", "k1"),
])
def test_option_values_are_typed(tmp_path, override, legal):
    """An illegal option value fails at load naming the key and the legal values."""
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(p, [override])
    assert override.split("=")[0] in str(e.value) and f"'{legal}'" in str(e.value)
    assert "\n" not in str(e.value)


def test_option_types_match_what_the_code_implements():
    assert config.choices(config.Agg) == algos.AGG_MODES
    assert config.choices(config.Ratio) == algos.RATIO_LEVELS
    assert config.choices(config.KL) == algos.KL_KINDS
    assert config.choices(config.ISLevel) == algos.IS_LEVELS
    assert config.choices(config.ISMode) == algos.IS_MODES
    assert config.choices(config.HistoryMode) == algos.HISTORY_MODES
    assert config.choices(config.ScaleRewards) == algos.SCALE_MODES
    assert config.choices(config.LossType) == algos.LOSS_TYPES
    assert set(config.choices(config.Preset)) == set(config.PRESETS)
    assert config_rules.GROUP_RELATIVE == set(algos.ADVANTAGES) - {"reinforce"}  # no baseline
    transfers = {t for ts in config_rules.WEIGHT_TRANSFER.values() for t in ts}
    assert transfers == set(config.choices(config.WeightTransfer))


def test_yaml_off_reads_as_the_option_off(tmp_path):
    """YAML 1.1 reads a bare `off` as false; log.progress takes it as "off" (YAML and CLI)."""
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n"
                         "log: {progress: off}\n")
    assert config.load(p).log.progress == "off"
    assert config.load(p, ["log.progress=off"]).log.progress == "off"
    assert config.load(p, ["log.progress=lines"]).log.progress == "lines"


def test_presets_and_plain_reinforce_are_legal(tmp_path):
    p = _write(tmp_path, "data: {train: x.jsonl}\nrewards: [{name: accuracy}]\n")
    for preset in config.PRESETS:
        assert config.load(p, [f"algo.preset={preset}"]).algo.preset == preset
    cfg = config.load(p, ["algo.preset=cispo"])
    assert (cfg.algo.loss_type, cfg.algo.clip_low) == ("cispo", 1.0)
    # REINFORCE has no baseline: one sample per prompt is a meaningful batch.
    assert config.load(p, ["algo.advantage=reinforce", "rollout.num_generations=1"])


def test_mmrl_train_validates_before_building_anything(tmp_path):
    """A bad registry name stops `mmrl train` at once with the same lines as `mmrl validate`
    (the data file does not even exist: nothing was built or read)."""
    p = _write(tmp_path, "data: {train: missing.jsonl}\nmodel: {family: nope}\n"
                         f"rewards: [{{name: accuracy}}]\nlog: {{run_dir: {tmp_path}/run}}\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["train", str(p)])
    assert str(e.value).startswith("config error: model.family:"), str(e.value)
    assert not (tmp_path / "run").exists()


def test_auto_values_resolve_in_the_config_rules():
    from mmrl.config_rules import resolve_progress, resolve_weight_transfer

    assert resolve_weight_transfer("auto", "colocated", in_process=True) == "direct"
    assert resolve_weight_transfer("auto", "colocated", in_process=False) == "bytes"
    assert resolve_weight_transfer("auto", "server") == "http"
    assert resolve_weight_transfer("store", "server") == "store"
    assert resolve_progress("auto", tty=True) == "bar"
    assert resolve_progress("auto", tty=False) == "lines"
    assert resolve_progress("off", tty=True) == "off"


def test_stop_metric_names_a_repeated_reward_by_its_logged_key():
    """Two rewards of one name log as <name>_0, <name>_1 (RewardSet); sft.stop_metric reads
    those keys, and an error lists them."""
    assert config_rules.reward_keys(["jaccard", "jaccard", "format", "my.mod:score"]) == [
        "jaccard_0", "jaccard_1", "format", "score"]
    # jaccard twice: the metric with partial credit, then the exact set
    twice = ("rewards=[{name: jaccard, weight: 0.0}, {name: jaccard, weight: 1.0, params: "
             "{threshold: 1.0}}, {name: format, weight: 0.1}]")
    cfg = config.load("recipes/classification/config.yaml",
                      [twice, "sft.stop_metric=jaccard_1_mean"])
    assert cfg.sft.stop_metric == "jaccard_1_mean"
    with pytest.raises(config.ConfigError, match=r"no reward 'jaccard' in `rewards` to read it "
                       r"from \(its keys: jaccard_0, jaccard_1, format\)"):
        config.load("recipes/classification/config.yaml", [twice, "sft.stop_metric=jaccard_mean"])
