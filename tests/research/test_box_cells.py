"""research/probes/box_cells.py: boxes scored by grid column, row and cell against hand-worked
rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "box_cells.py"
sys.path.insert(0, str(SCRIPT.parent))
import box_cells  # noqa: E402


def _row(answer, solution):
    return {"answer": answer, "solution": solution, "fields": {"image_size": [84, 84]}}


def test_column_row_and_cell_rates_on_a_3x3_grid():
    rows = [
        _row("[0, 0, 20, 20]", [0, 0, 20, 20]),      # right cell, exact: IoU 1
        _row("[28, 0, 48, 20]", [0, 0, 20, 20]),     # right row, wrong column
        _row("[0, 56, 20, 76]", [0, 0, 20, 20]),     # right column, wrong row
        _row("[0, 0, 10, 20]", [0, 0, 20, 20]),      # right cell, half the box: IoU 0.5
        _row("not a box", [0, 0, 20, 20]),           # a miss everywhere
    ]
    s = box_cells.score(rows, 3)
    assert (s["n"], s["column"], s["row"], s["cell"], s["unparsed"]) == (5, 0.6, 0.6, 0.4, 0.2)
    assert s["iou_in_right_cell"] == pytest.approx(0.75)
    assert box_cells.cell([80, 80, 84, 84], [84, 84], 3) == (2, 2)  # the far edge stays on the grid


def test_command_line_prints_the_rates_of_each_file(tmp_path):
    """Run as users run it: `python research/probes/box_cells.py RUN/eval/before_rl.jsonl`."""
    path = tmp_path / "before_rl.jsonl"
    rows = [_row("[0, 0, 20, 20]", [0, 0, 20, 20]), _row("[28, 0, 48, 20]", [0, 0, 20, 20])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(path), "--cells", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"{path}: 2 boxes  column 0.50  row 1.00  cell 0.50  "
                                   "IoU in the right cell 1.00  unparsed 0.00")
