"""`validate(cfg)`: everything `mmrl validate` and `mmrl train` check before building anything.

The config's own rules (legal values, ranges, cross-field: mmrl/config.py, mmrl/config_rules.py)
plus every name a registry must resolve (model family, advantage, data format, generator,
rewards and their params, tools and their settings) and every optional package the run imports
(wandb, vllm, deepspeed). Instantiates no model and reads no data. Lives above config.py (it
imports the registries, which import config) so config.py stays at the bottom of the graph.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from mmrl import config_rules
from mmrl.config import clip


def validate(cfg, world: int = 1) -> list[str]:
    """Every problem of `cfg` for a run on `world` processes, one line each (empty: valid)."""
    from mmrl import algos
    from mmrl.data.schema import FORMATS
    from mmrl.data.synthetic import GENERATORS
    from mmrl.models import MODELS
    from mmrl.train.scoring import bind_reward

    problems = list(config_rules.problems(cfg, world))

    def check(what, fn):
        try:
            fn()
        except Exception as e:  # collect every problem, not just the first
            problems.append(f"{what}: {e}")

    check("model.family", lambda: MODELS.get(cfg.model.family))
    check("algo.advantage", lambda: algos.get_advantage(cfg.algo.advantage))
    check("data.format", lambda: cfg.data.format is None or FORMATS.get(cfg.data.format))
    if cfg.data.generate:
        check("data.generate", lambda: GENERATORS.get(cfg.data.generate))
    if cfg.data.prompt_template:
        from mmrl.data.prompts import resolve
        check("data.prompt_template", lambda: resolve(cfg.data.prompt_template))
    if not cfg.rewards:
        problems.append("rewards: none configured")
    for i, spec in enumerate(cfg.rewards):
        check(f"rewards[{i}] ({spec.name})", lambda spec=spec: bind_reward(spec))
    if cfg.tools.use:  # every tool imports and takes its settings
        from mmrl.tools import Toolbox
        check("tools.use", lambda: Toolbox.from_config(cfg.tools))
    if cfg.multi_turn and not cfg.tools.use:  # the class imports and takes env.args
        from mmrl.rollout.environments import make_environments
        check("env", lambda: make_environments(cfg, None).make())
    if cfg.rollout.runs_hf_generate:  # compile_decode=on where the family cannot compile
        from mmrl.rollout.hf import family_decode_path
        check("rollout.compile_decode",
              lambda: family_decode_path(cfg.model.family, cfg.rollout.compile_decode))
    check("train.parallel", lambda: problems.extend(missing_packages(cfg)))
    return [clip(p, 1000) for p in problems]  # a line may echo a value: never 10 MB of it


def missing_packages(cfg) -> list[str]:
    """A line for each optional package (wandb, vllm, deepspeed) the config needs and this
    environment lacks: found here, before a model loads, not at the first import mid-run."""
    from mmrl.train import parallel

    return [f"{setting} needs {package}, which is not installed: {fix}"
            for package, setting, fix in config_rules.optional_packages(cfg, parallel.resolve(cfg))
            if importlib.util.find_spec(package) is None]


def data_warnings(cfg) -> list[str]:
    """Missing data files are warnings, not errors: recipes name data you prepare first."""
    from mmrl.data.hub import split_selector

    if cfg.data.generate:
        return []
    return [f"data.{k}: {getattr(cfg.data, k)} does not exist yet (see the recipe README to "
            f"prepare it)" for k in ("train", "eval")
            if getattr(cfg.data, k) and not Path(split_selector(getattr(cfg.data, k))[0]).exists()]
