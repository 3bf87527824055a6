"""research/probes/second_draw.py on a finished tiny run: evaluated on the run's own held-out
file, its cells are the run's own summary (before RL from the saved KL reference, after RL and
the shuffled-media control from the last checkpoint), through `mmrl eval` as a user runs it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mmrl import config
from mmrl.train.run import train

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "second_draw.py"
sys.path.insert(0, str(SCRIPT.parent))
import second_draw  # noqa: E402

pytestmark = pytest.mark.integration


def test_cells_of_a_finished_run_on_its_own_draw_are_its_summary(tmp_path, tiny_config,
                                                                 user_rewards, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(user_rewards))  # the run's reward, for `mmrl eval`
    data = tmp_path / "data"
    path = tiny_config(tmp_path / "cfg.yaml", data,
                       data={"eval": "{data}/eval.jsonl",
                             "generate_kwargs": {"n_train": 8, "n_eval": 6}},
                       algo={"beta": 0.04}, train={"steps": 1, "save_every": 1},
                       eval={"before_rl": True, "shuffled_images": True},
                       log={"run_dir": str(tmp_path / "run")})
    summary = train(config.load(str(path)))
    run = tmp_path / "run"
    assert (run / "reference").is_dir()
    held_out = data / "eval.jsonl"
    got = second_draw.cell(run, held_out)
    assert got == {"before": summary["accuracy_before_rl"], "after": summary["accuracy_after_rl"],
                   "shuffled": summary["accuracy_shuffled_images"], "n": 6}
    # An untrained tiny model's accuracy is 0 either way: the reward means tell the warm-up's
    # weights (the reference) from the updated ones, and each matches its own evaluation.
    before = second_draw.mmrl_eval(run, run / "reference", held_out, False)["reward_mean"]
    after = second_draw.mmrl_eval(run, run, held_out, False)["reward_mean"]
    assert before == pytest.approx(summary["eval_before_rl"]["reward_mean"])
    assert after == pytest.approx(summary["eval_after_rl"]["reward_mean"])
    assert before != pytest.approx(after)
    text = second_draw.table({"counting": {0: {**got, "before": None}}}, 202)
    assert text.splitlines()[0] == "eval seed 202"
    assert text.splitlines()[-1].startswith("| counting | 0 | 6 | - | ")



def test_blind_band_is_the_binomial_tail_past_the_band():
    # 4 records at chance 0.25: past 0.30 means 2 or more right, 1 - 0.75^4 - 4 * 0.25 * 0.75^3
    assert second_draw.blind_band(4) == pytest.approx({"se": (0.25 * 0.75 / 4) ** 0.5,
                                                       "above": 1 - 0.75 ** 4 - 0.75 ** 3})
    hundred = second_draw.blind_band(100)  # 31 or more of 100 (0.30 itself is inside the band)
    assert hundred["se"] == pytest.approx(0.0433, abs=1e-4)
    assert hundred["above"] == pytest.approx(0.1038, abs=1e-4)
