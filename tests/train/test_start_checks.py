"""`mmrl train` stops at its start, before any model is built, when its main metric can score no
eval record: the video_qa recipe routes accuracy to Video-R1's problem types, and its synthetic
set's records are all task video_qa (accuracy_after_rl ended NaN, silently)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mmrl import config
from mmrl.train.loop import Trainer


def test_a_metric_that_scores_no_eval_record_stops_the_run_naming_reward_task_and_record(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = Path(__file__).parents[2] / "recipes" / "video_qa" / "config.yaml"
    cfg = config.load(str(recipe), [
        "data.train=data/train.jsonl", "data.eval=data/eval.jsonl", "data.format=mmrl",
        "data.generate=video_qa", "data.generate_kwargs={n_train: 4, n_eval: 2}",
        "model.path=tiny", "model.dtype=float32", "model.attn_implementation=sdpa",
        "model.gradient_checkpointing=false", f"log.run_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError) as e:
        Trainer(cfg)
    msg = str(e.value)
    assert msg.startswith("eval.metric_reward 'accuracy' can score none of the 2 eval records")
    assert "routed to tasks ['multiple_choice', 'numerical']" in msg
    assert "eval records' tasks are ['video_qa']" in msg
    assert "first record: " in msg and "eval.jsonl:1" in msg


def test_a_metric_routed_per_task_scores_every_task_it_is_routed_to():
    """eval accuracy under video_qa's routing counts numerical questions too, not only the
    first accuracy entry's multiple choice."""
    from mmrl.config import RewardSpec
    from mmrl.train.evaluate import row_metrics
    from mmrl.train.scoring import RewardSet
    from mmrl.types import Sample

    rewards = RewardSet([
        RewardSpec(name="accuracy", params={"mode": "choice"}, tasks=["multiple_choice"]),
        RewardSpec(name="accuracy", params={"mode": "numeric"}, tasks=["numerical"]),
        RewardSpec(name="format", weight=0.5)])
    samples = [Sample(id="a", messages=[], solution="B", task="multiple_choice"),
               Sample(id="b", messages=[], solution="7", task="numerical"),
               Sample(id="c", messages=[], solution="x", task="ocr")]
    _, per = rewards.score(samples, ["<answer>B</answer>", "<answer>7.0</answer>", "x"])
    assert row_metrics(rewards, "accuracy", per) == [1.0, 1.0, None]


def test_eval_records_with_an_empty_solution_stop_the_run_naming_the_first(tiny_config, tmp_path):
    """Such a record cannot be measured: accuracy scored it 0.0 (a wrong eval accuracy), a reward
    returning None left a bare `nan`."""
    import json

    from mmrl.data.synthetic import GENERATORS

    GENERATORS.get("counting")(tmp_path / "data", n_train=4, n_eval=3)
    evals = tmp_path / "data" / "eval.jsonl"
    rows = [json.loads(line) for line in evals.read_text().splitlines()]
    rows[1]["solution"] = " "
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tiny_config(tmp_path / "tiny.yaml", tmp_path / "data",
                       data={"eval": "{data}/eval.jsonl", "generate": None})
    with pytest.raises(ValueError) as e:
        Trainer(config.load(path, [f"log.run_dir={tmp_path / 'run'}"]))
    assert str(e.value).startswith(f"1 of the 3 eval records checked have an empty solution "
                                   f"(first: {evals}:2): accuracy cannot score them")
