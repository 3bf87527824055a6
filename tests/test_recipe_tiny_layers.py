"""Each recipe's tiny.yaml shrinks the run and changes nothing it measures: the recipe's rewards
(their task routing included) and prompt template stay; the warm-up teaches the shape the prompt
asks for, which `format` and the recipe's main metric both score 1.0 on every tiny record; and
every step's rollouts are logged, so a smoke run's report shows its media."""
from __future__ import annotations

from pathlib import Path

import pytest

from mmrl import config
from mmrl.data.prepare import build_datasets
from mmrl.data.prompts import last_user
from mmrl.models import get_adapter
from mmrl.train.evaluate import row_metrics
from mmrl.train.scoring import RewardSet
from mmrl.train.sft import target_text
from rewards.format import _think_mode

ROOT = Path(__file__).resolve().parents[1]
TINY = sorted((ROOT / "recipes").glob("*/tiny.yaml"))


def _load(tiny: Path, *overrides: str):
    return config.load(str(tiny.with_name("config.yaml")), [str(tiny), *overrides])


@pytest.mark.parametrize("tiny", TINY, ids=lambda p: p.parent.name)
def test_tiny_keeps_the_recipes_rewards_and_template_and_logs_every_step(tiny):
    recipe, cfg = config.load(str(tiny.with_name("config.yaml"))), _load(tiny)
    assert cfg.rewards == recipe.rewards  # names, weights, params and `tasks` routing
    assert cfg.data.prompt_template == recipe.data.prompt_template
    assert cfg.log.rollouts_every == 1


def _prompt(sample) -> str:
    _, user = last_user(sample, "test")
    content = user["content"]
    return content if isinstance(content, str) else " ".join(
        c.get("text") or "" for c in content if c.get("type") == "text")


@pytest.mark.parametrize("tiny", TINY, ids=lambda p: p.parent.name)
def test_tiny_prompts_ask_for_what_format_scores_and_the_warmup_target_scores_one(
        tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tiny data is written under data/ where the run starts
    cfg = _load(tiny, "data.generate_kwargs={n_train: 4, n_eval: 2}")
    train, evals = build_datasets(cfg, get_adapter(cfg.model.family).image_factor)
    samples = [train[i] for i in range(len(train))] + [evals[i] for i in range(len(evals))]
    if cfg.multi_turn and not cfg.tools.enabled:
        return _walk_the_demonstrations(cfg, samples)
    fmt = next(spec for spec in cfg.rewards if spec.name == "format")
    asks_think = _think_mode(fmt.params.get("think", True)) == "true"
    assert all(("<think>" in _prompt(s)) == asks_think for s in samples), _prompt(samples[0])
    rewards = RewardSet(cfg.rewards)
    _, per = rewards.score(samples, [target_text(cfg.sft, s) for s in samples])
    assert per["format"] == [1.0] * len(samples)
    assert row_metrics(rewards, cfg.eval.metric_reward, per) == [1.0] * len(samples)


def _walk_the_demonstrations(cfg, samples):
    """An environment recipe (env.name): its metric is the environment's verdict, so the
    warm-up's demonstration, turn by turn through the environment, must score 1.0 on it."""
    from mmrl.envs import ENVIRONMENTS
    from mmrl.train.sft import fill

    rewards = RewardSet(cfg.rewards)
    for s in samples:
        env = ENVIRONMENTS.get(cfg.env.name)(**cfg.env.args)
        env.reset(s)
        for target in cfg.sft.turn_targets:
            step = env.step(None, fill(target, s))
            if step.done:
                break
        assert step.done, s.id
        _, per = rewards.score([s], ["-"], {"info": [step.info]})
        assert row_metrics(rewards, cfg.eval.metric_reward, per) == [1.0], (s.id, step.info)
