"""research/probes/lone_shapes.py: lone shapes named right, against hand-counted rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "lone_shapes.py"
sys.path.insert(0, str(SCRIPT.parent))
import lone_shapes  # noqa: E402

ROWS = [
    {"answer": "circle", "solution": "square", "metric": 0.0},             # lone square, wrong
    {"answer": "square", "solution": "square", "metric": 1.0},             # lone square, right
    {"answer": "square, circle", "solution": "circle", "metric": 0.5},     # a hedge is not right
    {"answer": None, "solution": "circle", "metric": 0.0},                 # no answer
    {"answer": "circle", "solution": "circle, triangle", "metric": 0.5},   # not a lone shape
]


def test_counts_only_lone_shapes_answered_exactly():
    c = lone_shapes.count(ROWS, ["circle", "square"])
    assert c["square"] == (1, 2) and c["circle"] == (0, 2)
    assert c["metric"] == 2.0 / 5


def test_prints_each_evaluation_in_training_order(tmp_path):
    ev = tmp_path / "run" / "eval"
    ev.mkdir(parents=True)
    for name, rows in [("after_rl", ROWS[:2]), ("step_000100", ROWS[:1]), ("before_rl", ROWS)]:
        (ev / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run")], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[1:] == ["  before_rl: 0.40 circle 0/2 square 1/2",
                       "  step_000100: 0.00 circle 0/0 square 0/1",
                       "  after_rl: 0.50 circle 0/0 square 1/2"]


def test_names_what_the_records_were_answered_and_reads_rollouts(tmp_path):
    c = lone_shapes.count(ROWS, ["circle", "square"])
    assert c["named"]["circle"] == {"square, circle": 1, "": 1}
    run = tmp_path / "run"
    run.mkdir()
    rollouts = [{"step": 50, "answer": "1", "solution": "3"}] * 3 + \
        [{"step": 50, "answer": "3", "solution": "3"}, {"step": 100, "answer": "2", "solution": "2"}]
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    out = subprocess.run([sys.executable, str(SCRIPT), str(run), "--shapes", "2,3", "--named",
                          "--rollouts"], check=True, capture_output=True, text=True).stdout
    assert out.splitlines()[1:] == ["  rollouts step 50: nan 2 0/0 3 1/4 (1: 3, 3: 1)",
                                    "  rollouts step 100: nan 2 1/1 (2: 1) 3 0/0"]
