"""Issue #26's visual_search row at seed 0, as `research/learning_table.sh --rows visual_search`
runs it (docs/learning.md): the generator's records, the demonstration warm-up, then GRPO on
two-turn trajectories whose crops come back as new image tokens. Its own file,
so pytest-xdist can run it beside the other learning rows (508 s on one thread beside
another worker in a full run on 2026-12-02, 11-14 min on busier days: CI's longest test)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "research"))
import learning_table  # noqa: E402


def test_visual_search_learns_to_look_again(tmp_path):
    """The warm-up re-looks at the whole image when greedy (chance); RL must make the model zoom
    on the mark. The tool row gains the bar and ends the bar above chance, where its no-tool
    control stays (measured beside it in docs/learning.md), and more held-out crops find the
    mark."""
    r = learning_table.run_row("visual_search", 0, tmp_path / "data", tmp_path / "runs")
    assert r["after"] - r["before"] >= learning_table.BAR_GAIN, r
    assert r["after"] >= r["chance"] + learning_table.BAR_GAIN, r
    assert abs(r["shuffled"] - r["chance"]) <= learning_table.BAR_CHANCE + 1e-9 or \
        r["shuffled"] <= r["before"], r
    use = r["tool_use"]
    assert use["after"]["called"] == 1.0 and use["after"]["found"] > use["before"]["found"], r
