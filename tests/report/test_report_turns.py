"""The report draws a tool trajectory turn by turn, from rollouts.jsonl records built the way the
trainer builds them (real calls parsed from model turns, run by the real Toolbox on generated
media, recorded by `rollout_records`): the crop box at the original-pixel place the tool cut,
beside the crop that came back; the returned frames' ticks at their times on the video's
timeline, inside the shaded span; the clip's span shaded at its x range of the waveform; an
error with its kind and message. Pictures are read back from the page's PNGs."""
from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.data.synthetic_av import write_mp4, write_wav
from mmrl.report import build_report, tooldraw
from mmrl.tools import ToolContext, Toolbox, load_tool, parse_turn
from mmrl.train.rollout_utils import rollout_records
from mmrl.types import (Observation, PromptFeatures, RolloutBatch, Sample, ScoredBatch,
                        Trajectory)

BUDGET = (28 * 28, 28 * 28 * 16)
IMAGE, INPUT = (400, 300), (200, 150)  # the model saw the image at half size
BOX, BOX_ORIGINAL = [10, 20, 60, 70], [20, 40, 120, 140]  # hand-mapped: x2 per axis
VIDEO_SECONDS, SPAN = 8.0, (2.0, 4.0)
AUDIO_SECONDS, CLIP = 2.0, (0.5, 1.0)


def _call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


TURNS = [
    "Let me look closer. " + _call("crop", bbox_2d=BOX) + _call("frames", start=2, end=4),
    "Now the sound. " + _call("audio_clip", start=0.5, end=1.0) + _call("crop", bbox_2d=[300, 0, 400, 50]),
    "<answer>3</answer>",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("turns")
    media = root / "media"
    media.mkdir()
    Image.new("RGB", IMAGE, (200, 200, 200)).save(media / "big.png")
    # Frame k of the 4 fps video is grey level 8 k: a drawn thumbnail tells its time.
    write_mp4(media / "clip.mp4", np.stack([np.full((32, 32, 3), 8 * k, np.uint8)
                                            for k in range(int(VIDEO_SECONDS * 4))]), 4)
    sr = 16000
    t = np.arange(int(AUDIO_SECONDS * sr)) / sr
    write_wav(media / "tone.wav", 0.4 * np.sin(2 * np.pi * 300 * t), sr)
    sample = Sample(id="s0", messages=[], solution="3", task="search", source="t.jsonl:1",
                    images=[str(media / "big.png")], videos=[str(media / "clip.mp4")],
                    audios=[str(media / "tone.wav")])
    prompt = PromptFeatures(sample=sample, tensors={})
    context = ToolContext(prompt=prompt, input_sizes=[INPUT], images=sample.images,
                          videos=sample.videos, audios=sample.audios, image_pixels=BUDGET)
    box = Toolbox([load_tool("crop"), load_tool("frames", {"fps": 2.0}), load_tool("audio_clip")])
    traj, outcomes = Trajectory(turns=len(TURNS), turn_texts=TURNS), []
    for turn, text in enumerate(TURNS[:-1]):
        calls = parse_turn(text, "qwen").calls
        answered = box.run([(c, context, list(box.tools)) for c in calls])
        outcomes += answered
        traj.calls += [o.record(c, turn) for c, o in zip(calls, answered)]
        traj.observations.append(Observation(start=10 * turn, length=7, tensors={}))
    batch = RolloutBatch(prompts=[prompt], completion_ids=torch.zeros(1, 4, dtype=torch.long),
                         completion_mask=torch.ones(1, 4, dtype=torch.long),
                         group_ids=torch.zeros(1, dtype=torch.long), sampler_logp=None,
                         texts=[TURNS[-1]], truncated=torch.tensor([False]), trajectories=[traj])
    zero = torch.zeros(1)
    (record,) = rollout_records(ScoredBatch(batch, zero, {}, zero), 1)
    (root / "rollouts.jsonl").write_text(json.dumps({"step": 1, **record}) + "\n")
    page = build_report([root]).read_text()
    return json.loads(json.dumps(record)), outcomes, page


def _pngs(page: str, cls: str) -> list[np.ndarray]:
    pat = re.compile(r'<img class="([^"]*)" src="data:image/png;base64,([^"]+)"')
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(2)))).convert("RGB"))
            .astype(int) for m in pat.finditer(page) if cls in m.group(1).split()]


def _is(px, colour, tol: int = 30) -> bool:
    return all(abs(int(a) - b) <= tol for a, b in zip(px, colour))


def _runs(row: np.ndarray, colour) -> list[tuple[int, int]]:
    """(first, last) x of each run of `colour` pixels along one image row."""
    xs = [x for x in range(row.shape[0]) if _is(row[x], colour)]
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return [tuple(r) for r in runs]


def _x(t: float, duration: float, width: int) -> int:
    return round(t / duration * (width - 1))


def test_records_carry_what_each_call_read_and_its_errors(run):
    record, _, _ = run
    crop, frames, clip, bad = record["calls"]
    assert crop["seen"][0]["box"] == BOX_ORIGINAL and crop["seen"][0]["size"] == list(IMAGE)
    assert crop["seen"][0]["path"].endswith("big.png")
    assert frames["seen"][0]["span"] == list(SPAN) and frames["seen"][0]["duration"] == \
        pytest.approx(VIDEO_SECONDS, abs=0.3)
    assert clip["seen"][0]["span"] == list(CLIP) and [c["turn"] for c in record["calls"]] == \
        [0, 0, 1, 1]
    assert bad["error"] == "bad_box" and "outside the image" in bad["message"] and not bad["seen"]


def test_crop_box_outlined_where_the_tool_cut_beside_the_crop(run):
    record, outcomes, page = run
    (drawn,) = _pngs(page, "tool-crop-box")
    s = drawn.shape[1] / IMAGE[0]
    x1, y1, x2, y2 = (v * s for v in BOX_ORIGINAL)
    my, mx = int((y1 + y2) / 2), int((x1 + x2) / 2)
    for y, x in [(my, int(x1) + 1), (my, int(x2) - 2), (int(y1) + 1, mx), (int(y2) - 2, mx)]:
        assert _is(drawn[y, x], tooldraw.TOOL), (y, x, drawn[y, x])
    for y, x in [(my, mx), (my, int(x1) - 3), (my, int(x2) + 2), (int(y1) - 3, mx)]:
        assert not _is(drawn[y, x], tooldraw.TOOL), (y, x)  # an outline, and only there
    # The crop beside it is the one the model got back, redrawn from the original and `seen`.
    seen = record["calls"][0]["seen"][0]
    with Image.open(seen["path"]) as original:
        again = tooldraw.returned_crop(original.convert("RGB"), seen["box"], seen["returned"])
    returned = outcomes[0].items[0]
    assert again.size == returned.size == tuple(seen["returned"])
    assert np.abs(np.asarray(again, int) - np.asarray(returned, int)).max() <= 1
    (shown,) = _pngs(page, "tool-crop")
    assert abs(shown.shape[1] / shown.shape[0] - returned.width / returned.height) < 0.02


def test_frames_ticks_at_their_times_inside_the_shaded_span(run):
    record, outcomes, page = run
    (im,) = _pngs(page, "tool-frames")
    seen = record["calls"][1]["seen"][0]
    times = seen["timestamps"]
    assert times == pytest.approx(outcomes[1].items[0].timestamps) and len(times) >= 3
    width, duration = im.shape[1], seen["duration"]
    lane = [y for y in range(im.shape[0]) if any(_is(p, tooldraw.SPAN, 8) for p in im[y])]
    row = im[lane[len(lane) // 2]]
    ticks = _runs(row, tooldraw.TOOL)
    assert len(ticks) == len(times)
    for (a, b), t in zip(ticks, times):
        assert abs((a + b) / 2 - _x(t, duration, width)) <= 1
    covered = [x for x in range(width) if _is(row[x], tooldraw.SPAN, 8) or _is(row[x], tooldraw.TOOL)]
    assert abs(covered[0] - _x(SPAN[0], duration, width)) <= 1
    assert abs(covered[-1] - _x(SPAN[1], duration, width)) <= 1
    # Each thumbnail is the frame returned at its time (grey level 8 per frame at 4 fps).
    cell = width / len(times)
    for i, t in enumerate(times):
        grey = im[tooldraw.THUMB_HEIGHT // 2, int((i + 0.5) * cell)]
        assert abs(grey.mean() - 8 * 4 * t) <= 10, (t, grey)


def test_clip_span_shaded_on_the_waveform(run):
    _, _, page = run
    (im,) = _pngs(page, "tool-clip")
    width = im.shape[1]
    shaded = _runs(im[1], tooldraw.SPAN)  # the top row: above a 0.4-amplitude wave
    assert len(shaded) == 1
    (a, b), = shaded
    assert abs(a - _x(CLIP[0], AUDIO_SECONDS, width)) <= 1
    assert abs(b - _x(CLIP[1], AUDIO_SECONDS, width)) <= 1
    middle = im[im.shape[0] // 2 - 10]  # the wave is drawn, across the whole clip
    assert len([x for x in range(width) if _is(middle[x], tooldraw.WAVE, 10)]) > width // 2


def test_turns_in_order_with_each_calls_pictures_and_errors(run):
    _, _, page = run
    at = [page.index(s) for s in ("Let me look closer.", 'class="tool-crop-box"',
                                  'class="tool-frames"', "Now the sound.", 'class="tool-clip"',
                                  "error (bad_box):", "&lt;answer&gt;3&lt;/answer&gt;")]
    assert at == sorted(at)
    assert "lies outside the image" in page and page.count('class="tool-error"') == 1
    assert page.count("observation: 7 tokens") == 2 and "4 call(s)" in page
