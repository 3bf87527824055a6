"""scripts/box_cells.py: boxes scored by grid column, row and cell against hand-worked rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
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
