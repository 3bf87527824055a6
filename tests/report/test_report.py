"""mmrl/report: the HTML run report, built from a synthetic run dir (mmrl/report/synthetic.py)."""
from __future__ import annotations

import base64
import doctest
import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from mmrl.report import build_report, curves, draw, load, media, page, parse, rollouts, synthetic


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    a = synthetic.write_synthetic_run(root / "runA")
    b = synthetic.write_synthetic_run(root / "runB", seed=1, offset=0.1)
    return a, b


@pytest.fixture(scope="module")
def html_a(runs):
    return build_report([runs[0]]).read_text()


def _imgs(html: str, cls: str) -> list[str]:
    """Base64 payloads of <img> tags whose class list contains `cls`."""
    pat = re.compile(r'<img class="([^"]*)" src="data:image/png;base64,([^"]+)"')
    return [m.group(2) for m in pat.finditer(html) if cls in m.group(1).split()]


def _png(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")).astype(int)


def _is_red(px) -> bool:
    return px[0] > 200 and px[1] < 60 and px[2] < 60


def _is_green(px) -> bool:
    return px[1] > 140 and px[0] < 60 and px[2] < 60


def test_default_output_path_and_sections(runs, html_a):
    assert (runs[0] / "report.html").is_file()
    for section in ("summary", "curves", "rollouts"):
        assert f'<section id="{section}">' in html_a
    # summary.json values and the config excerpt are in the summary table
    assert "accuracy_after_rl" in html_a and "accuracy×1.0, format×0.5" in html_a
    assert "phases.share.rollout" in html_a and "phases.decode_bandwidth_share" in html_a


def test_one_embedded_png_per_plot_and_nothing_external(runs, html_a):
    run = load.load_run(runs[0])
    groups = curves.curve_groups([run])
    plots = _imgs(html_a, "plot")
    assert len(plots) == len(groups) >= 15
    for b64 in plots:
        assert _png(b64).shape[2] == 3  # decodes as a real image
    assert not re.search(r'(src|href)="(https?:)?//', html_a)  # offline: no CDN, no remote media
    assert "<link" not in html_a


def test_every_logged_metric_is_in_some_plot(runs):
    run = load.load_run(runs[0])
    plotted = {k for g in curves.curve_groups([run]) for k in g.keys}
    banded = {k.replace("_mean", "_std") for k in plotted if k.startswith("reward/")}
    assert run.metric_keys - plotted - banded == set()
    assert "grad_norm_clipped" not in run.metric_keys  # all-null columns are not curves
    titles = {g.title: g.keys for g in curves.curve_groups([run])}
    assert titles["Rollout: prefill and decode"] == ["time/rollout_prefill", "time/rollout_decode"]
    assert "speed/decode_bandwidth_share" in titles["Decode bandwidth and update MFU"]


def test_predicted_box_red_and_ground_truth_green(html_a):
    drawn = _png(_imgs(html_a, "drawn-boxes")[0])  # first rollout: PRED_BOX vs GT_BOX
    scale = drawn.shape[1] / synthetic.IMAGE_SIZE[0]
    px, py, px2, _ = [v * scale for v in synthetic.PRED_BOX]
    gx, gy, _, gy2 = [v * scale for v in synthetic.GT_BOX]
    mid_pred_y = int((synthetic.PRED_BOX[1] + synthetic.PRED_BOX[3]) / 2 * scale)
    mid_gt_y = int((gy + gy2) / 2)
    assert _is_red(drawn[mid_pred_y, int(px) + 1])  # left edge of the predicted box
    assert _is_red(drawn[mid_pred_y, int(px2) - 1])  # right edge
    assert _is_green(drawn[mid_gt_y, int(gx) + 1])  # left edge of the ground-truth box
    assert not _is_red(drawn[mid_gt_y, int(gx) + 1])
    inside = drawn[int(py) + 10: int(py) + 20, int(px) + 10: int(px) + 20]
    assert not any(_is_red(p) for p in inside.reshape(-1, 3))  # outlines, not filled boxes


def _bands(im: np.ndarray, is_colour) -> list[tuple[int, int]]:
    """(first, last) column of each horizontal band of `is_colour` pixels, top to bottom."""
    rows = [y for y in range(im.shape[0]) if any(is_colour(p) for p in im[y])]
    bands, start = [], None
    for y, nxt in zip(rows, rows[1:] + [None]):
        start = y if start is None else start
        if nxt != y + 1:
            cols = [x for x in range(im.shape[1]) if any(is_colour(p) for p in im[start:y + 1, x])]
            bands.append((cols[0], cols[-1]))
            start = None
    return bands


def test_video_timeline_has_the_truth_and_one_lane_per_rollout(html_a):
    im = _png(_imgs(html_a, "timeline")[0])  # preds "0.5 to 1.2", "[0.7, 1.5]"; gt [0.8, 1.6]
    at = [round(t / 2.0 * (im.shape[1] - 1)) for t in (0.5, 1.2, 0.7, 1.5, 0.8, 1.6)]
    (r1a, r1b), (r2a, r2b) = _bands(im, _is_red)
    assert all(abs(a - b) <= 2 for a, b in zip((r1a, r1b, r2a, r2b), at[:4]))
    (ga, gb), = _bands(im, _is_green)
    assert abs(ga - at[4]) <= 2 and abs(gb - at[5]) <= 2
    assert im.shape[0] > 60  # the frame strip sits above the timeline


def test_a_video_without_segments_shows_its_frames_and_no_timeline(html_a):
    group = html_a.split("sample videoqa-0")[1].split('<div class="group">')[0]
    assert group.count('class="media-video"') == 1 and "timeline" not in group
    strip = _png(_imgs(group, "media-video")[0])
    assert not any(_is_red(p) or _is_green(p) for p in strip.reshape(-1, 3))


def test_media_appear_once_per_group(html_a):
    step = html_a.split('id="run0-step-1"')[1].split("</details>")[0]
    grounding = step.split("sample ground-0")[1].split('<div class="group">')[0]
    assert grounding.count('<div class="rollout"') == 3
    assert len(_imgs(grounding, "media-img")) == 1
    assert len(_imgs(step.split("sample video-0")[1], "timeline")) == 1


def test_the_answer_cell_shows_what_the_rewards_read(html_a):
    step = html_a.split('id="run0-step-1"')[1].split("</details>")[0]
    answers = re.findall(r"<tr><th>answer</th><td>(.*?)</td></tr>", step)
    # [10, 10, 50, 40] read from its answer block; the cut "<answer>[30, 30, 4" reads as nothing
    assert answers[:3] == ["[10, 10, 50, 40]", "[61, 21, 89, 69]", ""]


def test_audio_picture_and_transcript_diff(html_a):
    assert _imgs(html_a, "media-audio")
    # reference "The quick brown fox jumps over" vs "the quick brown fox jumped"
    assert '<del class="s">jumps</del><ins class="s">jumped</ins>' in html_a
    assert '<del class="d">over</del>' in html_a
    assert "WER 0.333" in html_a


def test_completion_is_escaped(html_a):
    assert synthetic.INJECTION not in html_a
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html_a
    assert html_a.count("<script") == 1  # the report's own step-opener, nothing injected
    assert "<img src=x" not in html_a


def test_missing_media_placeholder(runs, html_a):
    missing = runs[0] / "media" / "does_not_exist.png"
    assert f'<div class="missing">missing: {missing}</div>' in html_a


def test_default_steps_first_middle_last(html_a):
    ids = re.findall(r'<details class="step" id="run0-step-(\d+)"', html_a)
    assert ids == ["1", "20", "30"]  # logged: 1, 10, 20, 30


def test_chosen_steps_and_rollout_cap(runs):
    # the rollout section alone: build_report's plumbing of these arguments is covered above
    html = page.rollouts_section([load.load_run(runs[0])], steps=[10, 12], max_per_step=3)
    assert re.findall(r'id="run0-step-(\d+)"', html) == ["10"]
    assert "step 12 has no logged rollouts: showing step 10" in html
    assert html.count('<div class="rollout"') == 3


def test_two_runs_overlay_names_both(runs, tmp_path):
    a, b = load.load_run(runs[0]), load.load_run(runs[1])
    group = next(g for g in curves.curve_groups([a, b]) if g.title == "Reward per function")
    png, labels = curves.plot_group([a, b], group)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"runA: accuracy", "runB: accuracy", "runA: format", "runB: format"} <= set(labels)
    html = build_report([runs[0], runs[1]], out=tmp_path / "ab.html", steps=[30]).read_text()
    assert "mmrl report: runA vs runB" in html
    assert 'data-labels="runA: reward/total_mean|runB: reward/total_mean"' in html
    assert '<tr class="differs"><th>algo.beta</th>' in html  # differing config highlighted
    assert 'id="run0-step-30"' in html and 'id="run1-step-30"' in html


def test_same_dir_names_are_disambiguated(tmp_path):
    names = load.run_names([tmp_path / "x" / "seed0", tmp_path / "y" / "seed0"])
    assert names == ["x/seed0", "y/seed0"]


def test_broken_run_dir_still_reports(tmp_path):
    run = tmp_path / "broken"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/total_mean": 0.5})
                                       + "\n" + '{"step": 2, "reward/tot')  # killed mid-write
    (run / "rollouts.jsonl").write_text(json.dumps({"step": 1, "completion": "hi",
                                                    "images": ["/nope.png"],
                                                    "rewards": None, "reward": None}) + "\n")
    html = build_report([run]).read_text()
    assert "metrics.jsonl: skipped 1 unreadable line(s)" in html
    assert "missing: /nope.png" in html and 'id="run0-step-1"' in html


def test_corrupt_media_placeholder(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    record = {"images": [str(bad)], "videos": [str(bad)], "audios": [str(bad)], "completion": "x"}
    media_html = rollouts.group_media_html([(1, record)], [tmp_path], {}, parse.BoxRule())
    assert media_html.count('class="missing"') == 3 and "could not decode image" in media_html


def test_boxes_are_read_by_the_box_reward_and_mapped_as_its_coords_say():
    from rewards import get_reward

    config = {"rewards": [{"name": "accuracy"},
                          {"name": "iou", "params": {"coords": "qwen2_vl"}}]}  # 0..1000
    rule = parse.box_rule(config)
    record = {"completion": "<answer>[500, 250, 1000, 500]</answer>", "solution": [50, 20, 100, 40],
              "fields": {"image_size": [100, 80]}}
    assert parse.predicted_boxes(record, rule) == [(50.0, 20.0, 100.0, 40.0)]
    assert get_reward("iou")([record["completion"]], [record["solution"]], coords="qwen2_vl",
                             image_size=[[100, 80]]) == [1.0]  # the box drawn is the box scored
    # Four numbers picked out of garbage are no box to the reward, so none is drawn.
    garbage = dict(record, completion="<answer>[2.0, answer>[4.0, 44.0, 55.0]</answer>")
    assert parse.predicted_boxes(garbage, parse.BoxRule()) == []
    assert parse.predicted_boxes(dict(record, fields={}), rule) == []  # the reward scored None


@pytest.mark.parametrize("completion, segment", [
    ("<answer>from 2.5 to 7 seconds</answer>", (2.5, 7.0)),
    ("<answer>[1.0, 4.25]</answer>", (1.0, 4.25)),
    ("<answer>1 to 2 or 3 to 4</answer>", None),  # more than one segment: tiou reads none
    ("<answer>9 to 4</answer>", None),  # reversed: tiou scores 0, nothing to draw
    ("<answer>2 to 5", None),  # cut before the answer closed
])
def test_segments_are_read_by_the_tiou_reward(completion, segment):
    from rewards import get_reward

    assert parse.pred_segment(completion) == segment
    if segment is None:
        assert get_reward("tiou")([completion], [[0, 10]]) == [0.0]


def test_transcript_diff_direct():
    out = rollouts.transcript_diff("Hello, World!", "hello there world")
    assert "WER 0.500" in out and '<ins class="i">there</ins>' in out
    assert "WER 1.000" in rollouts.transcript_diff("a b", "")
    assert rollouts.transcript_diff("", "anything") == ""


@pytest.mark.parametrize("module", ["parse", "load"])
def test_doctests(module):
    # pytest's testpaths do not collect mmrl/, so the report's doctests run from here
    mod = {"parse": parse, "load": load}[module]
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0


def test_video_frames_are_sampled_across_the_clip(runs):
    # the synthetic clip's red channel ramps up over time: seeks must land in time order
    frames, times, duration = media.video_frames(runs[0] / "media" / "clip.mp4")
    assert duration == pytest.approx(2.0) and len(frames) == 6
    assert times == pytest.approx([(i + 0.5) / 3 for i in range(6)])
    reds = [np.asarray(f)[..., 0].mean() for f in frames]
    assert all(b > a + 10 for a, b in zip(reds, reds[1:]))


def test_the_demo_tool_trajectory_is_drawn_turn_by_turn(html_a):
    # its pictures are checked pixel by pixel in test_report_turns.py; here: all drawn, no gaps
    step = html_a.split('id="run0-step-1"')[1].split("</details>")[0]
    group = step.split("sample search-0")[1]
    for cls in ("tool-crop-box", "tool-crop", "tool-frames", "tool-clip"):
        assert len(_imgs(group, cls)) == 1, cls
    assert "error (bad_span): span 0.8..1.4 s" in group and 'class="missing"' not in group
