"""research/probes/blind_control.py on a hand-made control run: two 8-frame clips decoded with
the run's own settings (4 frames at 0.5 fps), one grey throughout, one with a red frame the
first look keeps and one with a red frame it skips; the answers' label split, as printed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mmrl import config
from mmrl.data.synthetic_av import write_mp4

SCRIPT = Path(__file__).resolve().parents[2] / "research" / "probes" / "blind_control.py"
sys.path.insert(0, str(SCRIPT.parent))
import blind_control  # noqa: E402


def _clip(path: Path, red_at: int | None) -> None:
    frames = np.full((16, 32, 32, 3), 200, np.uint8)  # 8 s at 2 fps
    if red_at is not None:
        frames[red_at] = (220, 30, 30)
    write_mp4(path, frames, 2)


def test_counts_records_whose_decoded_media_show_colour_and_splits_answers(tmp_path):
    (tmp_path / "videos").mkdir()
    plan = [("grey", None, "A", "A"), ("kept", 0, "B", "A"), ("skipped", 1, "C", "A")]
    for name, red_at, *_ in plan:
        _clip(tmp_path / "videos" / f"{name}.mp4", red_at)
    (tmp_path / "eval.jsonl").write_text("".join(
        json.dumps({"id": n, "task": "video_search", "videos": [f"videos/{n}.mp4"],
                    "prompt": "Which colour?", "solution": sol}) + "\n"
        for n, _, sol, _ in plan))
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    cfg = config.load(None, [f"data.train={tmp_path / 'eval.jsonl'}",
                             f"data.eval={tmp_path / 'eval.jsonl'}", "data.video_fps=0.5",
                             "data.video_max_frames=4", "data.video_max_pixels=12544"])
    config.save(cfg, run / "config.yaml")
    (run / "eval" / "after_rl.jsonl").write_text("".join(
        json.dumps({"id": n, "draw": 0, "answer": ans, "solution": sol}) + "\n"
        for n, _, sol, ans in plan))
    out = blind_control.report(run)
    assert out["records"] == 3 and out["coloured"] == 1  # frame 0 is kept at 0.5 fps, 1 is not
    assert out["answers"] == {"A": {"A": 1, "B": 1, "C": 1}} and abs(out["accuracy"] - 1 / 3) < 1e-9
    done = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 of 3 records show colour" in done.stdout and "answered 'A' on 3: labels A 1, B 1, C 1" \
        in done.stdout
