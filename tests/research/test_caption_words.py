"""research/probes/caption_words.py: captions scored word by word against hand-worked rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "caption_words.py"
sys.path.insert(0, str(SCRIPT.parent))
import caption_words  # noqa: E402

ROWS = [
    {"answer": "a red square", "solution": "a red circle"},              # shape wrong
    {"answer": "a red circle", "solution": "a red circle"},              # right
    {"answer": "a red square and a", "solution": "a red square and a blue square"},  # too short
    {"answer": None, "solution": "a blue triangle"},                     # no answer: too short
]


def test_length_position_and_word_counts():
    s = caption_words.score(ROWS, ["circle", "square", "triangle"])
    assert (s["n"], s["wrong_length"]) == (4, 2)
    assert s["wrong_at"] == {0: 0.0, 1: 0.0, 2: pytest.approx(0.5)}
    assert s["said"] == {"circle": 1, "square": 2, "triangle": 0}
    assert s["meant"] == {"circle": 2, "square": 2, "triangle": 1}


def test_command_line_prints_one_line_per_file(tmp_path):
    """Run as users run it: `python research/probes/caption_words.py RUN/eval/after_rl.jsonl`."""
    path = tmp_path / "after_rl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(path), "--words", "circle,square"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"{path}: 4 answers  wrong length 2  wrong word by position "
                                   "1:0.00 2:0.00 3:0.50  said/meant: circle 1/2  square 2/2")
