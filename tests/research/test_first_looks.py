"""research/probes/first_looks.py: first looks that found the target, against hand-made rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "first_looks.py"
sys.path.insert(0, str(SCRIPT.parent))
import first_looks  # noqa: E402


def _video(first_stamps, metric, card_start, turns=('{"span": [0, 3.5]}', "<answer>A</answer>"),
           later=()):
    calls = [{"name": "frames", "seen": [{"span": [s[0], s[-1]], "timestamps": list(s)}]}
             for s in ([first_stamps] if first_stamps else []) + list(later)]
    return {"draw": 0, "metric": metric, "answer": "A", "turns": list(turns), "calls": calls,
            "hit_turn_cap": False,
            "fields": {"flash_span": [2.0, 2.5], "card_span": [card_start, card_start + 3],
                       "duration": 8.0}}


ROWS = [
    _video([0.0, 0.5, 1.0, 1.5, 2.0], 1.0, 0.5),          # a returned frame at 2.0: found, right
    _video([0.0, 1.0, 3.0], 0.0, 1.0),                    # thinned: stepped over the flash
    _video([4.0, 4.5], 0.0, 4.5, later=[[2.0, 2.5]]),     # the second look found it: not first
    _video(None, 0.0, 5.0, turns=("<answer>B</answer>",)),  # no call at all
]


def test_found_counts_the_first_look_only():
    assert [first_looks.first_found(r, None) for r in ROWS] == [True, False, False, False]
    crop = {"calls": [{"seen": [{"box": [10, 10, 50, 50]}]}],
            "fields": {"mark_box": [20, 20, 30, 30]}}
    assert first_looks.first_found(crop, None) and not first_looks.first_found(crop, 2)


def test_summary_and_halves():
    s = first_looks.summarise(ROWS, None, halves=True)
    assert (s["found"], s["right_when_found"], s["records"]) == (1, 1.0, 4)
    assert s["metric"] == 0.25 and s["first_turns"]['{"span": [0, 3.5]}'] == 3
    assert s["card_half"] == {"first": 2, "second": 2}
    assert s["right_by_half"] == {"first": 1.0, "second": 0.0}


def test_prints_each_evaluation(tmp_path):
    ev = tmp_path / "run" / "eval"
    ev.mkdir(parents=True)
    for name in ("after_rl", "before_rl"):
        (ev / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run"), "--halves"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[1].startswith("before_rl") and out[2].startswith("after_rl")
    assert "found 1/4" in out[1] and "card halves {'first': 2, 'second': 2}" in out[1]


def test_rollouts_are_read_per_logged_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    samples = []
    for step, rows in ((20, ROWS[:2]), (40, ROWS[2:])):
        for r in rows:
            r = {k: v for k, v in r.items() if k not in ("metric", "draw")}
            samples.append({**r, "step": step, "rewards": {"accuracy": 0.0}})
    samples[0]["rewards"]["accuracy"] = 1.0  # the first look that found the flash, answered right
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    out = subprocess.run([sys.executable, str(SCRIPT), str(run), "--rollouts"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[1].startswith("step 20 (samples)") and "metric 0.50  found 1/2" in out[1]
    assert out[2].startswith("step 40 (samples)") and "metric 0.00  found 0/2" in out[2]
