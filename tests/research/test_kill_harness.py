"""research/kill_harness.py's judging, on hand-made run folders: a metric row missing or changed
is counted, a line cut short by a SIGKILL is no row, and a trial that lost or changed anything
counts none of its signals as survived."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "research"))
import kill_harness  # noqa: E402
import learning_rows  # noqa: E402


def _run(path: Path, rows: list[dict], weight: float, cut_line: bool = False) -> Path:
    ckpt = path / "checkpoints" / f"step_{kill_harness.STEPS:06d}"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.full((2,), weight)}, ckpt / "model.safetensors")
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (path / "metrics.jsonl").write_text(text + ('{"step": 13, "loss"' if cut_line else ""))
    return path


def test_compare_counts_lost_and_changed_values_and_ignores_a_cut_line(tmp_path):
    ref_rows = [{"step": s, "loss": 0.5, "time": 1.0} for s in range(1, kill_harness.STEPS + 1)]
    ref = _run(tmp_path / "ref", ref_rows, 1.0)
    got_rows = [dict(r, time=9.0) for r in ref_rows if r["step"] != 3]  # timings never compared
    got_rows[0]["loss"] = 0.6
    got = _run(tmp_path / "got", got_rows, 1.0, cut_line=True)
    result = kill_harness._compare(ref, got)
    assert result == {"steps_logged_once": False, "values_lost": 2, "values_changed": 1,
                      "values_compared": 2 * kill_harness.STEPS, "weights_identical": True}
    other = _run(tmp_path / "other", ref_rows, 2.0)
    assert kill_harness._compare(ref, other)["weights_identical"] is False


def test_summarise_counts_a_signal_survived_only_when_its_trial_is_whole():
    clean = {"steps_logged_once": True, "values_lost": 0, "values_changed": 0,
             "weights_identical": True, "values_compared": 10}
    event = {"in_checkpoint_write": True, "abandoned": False, "in_eval": False, "steps_redone": 1}
    trials = [
        {**clean, "events": [{**event, "signal": "SIGKILL", "exit": -9},
                             {**event, "signal": "SIGTERM", "exit": 143}]},
        {**clean, "values_changed": 3,
         "events": [{**event, "signal": "SIGTERM", "exit": 143, "in_eval": True}]},
        {**clean, "events": [{**event, "signal": "SIGTERM", "exit": 1}]},  # not a clean stop
    ]
    s = kill_harness._summarise(trials)
    assert s["SIGKILL"] == {"survived": 1, "tried": 1, "in_checkpoint_write": 1,
                            "rollout_abandoned": 0, "in_eval": 0, "steps_redone": 1}
    assert (s["SIGTERM"]["survived"], s["SIGTERM"]["tried"], s["SIGTERM"]["in_eval"]) == (1, 3, 1)
    assert (s["values_compared"], s["values_changed"], s["errors"]) == (30, 3, 0)


def test_every_learning_row_trains_a_recipe_with_a_layer():
    for row, (recipe, _) in learning_rows.ROWS.items():
        assert (ROOT / "research" / "layers" / f"{recipe}.yaml").is_file(), row
    assert set(learning_rows.GROUPS["methods"]) == set(learning_rows.METHODS)
