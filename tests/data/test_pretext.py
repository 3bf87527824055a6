"""Pretext tasks from the user's own media: every generated record's solution undoes the
transformation that was applied, and the named reward scores that solution 1.0."""
import json

import numpy as np
import pytest
from PIL import Image

from mmrl.data.media import load_video
from mmrl.data.pretext import _video_frames
from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_av import write_mp4
from rewards import get_reward

COLORS = [(250, 0, 0), (0, 250, 0), (0, 0, 250), (250, 250, 0), (0, 250, 250), (250, 0, 250),
          (250, 250, 250), (0, 0, 0)]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("my_images")
    for k in range(2):  # four coloured quadrants: every rotation and tile is distinguishable
        a = np.zeros((64, 64, 3), np.uint8)
        for q in range(4):
            a[(q // 2) * 32:(q // 2 + 1) * 32, (q % 2) * 32:(q % 2 + 1) * 32] = COLORS[q + 4 * k]
        Image.fromarray(a).save(root / f"photo{k}.png")
    (root / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("my_videos")
    for k in range(2):  # 8 frames of 8 flat colours: frame order is readable from pixels
        frames = np.stack([np.full((32, 32, 3), COLORS[(i + k) % 8], np.uint8) for i in range(8)])
        write_mp4(root / f"clip{k}.mp4", frames, fps=4)
    return root


def _records(paths):
    return [json.loads(line) for line in open(paths["train"])]


def _color_index(frame):
    mean = frame.reshape(-1, 3).mean(0)
    return int(np.argmin([np.abs(mean - c).sum() for c in COLORS]))


def test_rotation_solution_undoes_the_rotation(images, tmp_path):
    recs = _records(GENERATORS.get("rotation")(tmp_path, source=str(images), n_train=8, n_eval=0,
                                               size=64))
    assert len(recs) == 8 and {r["task"] for r in recs} == {"rotation"}
    for r in recs:
        shown = np.asarray(Image.open(tmp_path / r["images"][0]))
        source = np.asarray(Image.open(r["source"]).convert("RGB"))
        degrees = int(r["options"]["ABCD".index(r["solution"])].split(".")[1].split()[0])
        assert np.array_equal(np.rot90(shown, k=degrees // 90), source)  # undo clockwise
    assert get_reward("accuracy")([f"<answer>{r['solution']}</answer>" for r in recs],
                                  [r["solution"] for r in recs],
                                  options=[r["options"] for r in recs]) == [1.0] * 8


def test_patch_jigsaw_solution_reassembles_the_image(images, tmp_path):
    recs = _records(GENERATORS.get("patch_jigsaw")(tmp_path, source=str(images), n_train=6,
                                                   n_eval=0, size=64))
    for r in recs:
        shown = np.asarray(Image.open(tmp_path / r["images"][0]))
        source = np.asarray(Image.open(r["source"]).convert("RGB"))
        assert sorted(r["solution"]) == [1, 2, 3, 4]
        for pos, orig in enumerate(r["solution"]):
            o = orig - 1
            assert np.array_equal(shown[(pos // 2) * 32:(pos // 2 + 1) * 32, (pos % 2) * 32:(pos % 2 + 1) * 32],
                                  source[(o // 2) * 32:(o // 2 + 1) * 32, (o % 2) * 32:(o % 2 + 1) * 32])
    sols = [r["solution"] for r in recs]
    assert get_reward("order")([f"<answer>{','.join(map(str, s))}</answer>" for s in sols],
                               sols) == [1.0] * 6


def test_temporal_jigsaw_solution_gives_the_original_clip_order(videos, tmp_path):
    recs = _records(GENERATORS.get("temporal_jigsaw")(tmp_path, source=str(videos), n_train=4,
                                                      n_eval=0, clips=4, frames_per_clip=2,
                                                      size=32))
    for r in recs:
        v = load_video(str(tmp_path / r["videos"][0]), nframes=8, max_frames=8)
        shown = [_color_index(f) for f in v.frames]
        start = load_video(r["source"], nframes=8, max_frames=8)
        orig = [_color_index(f) for f in start.frames]
        want = [c for clip in r["solution"] for c in orig[(clip - 1) * 2:clip * 2]]
        assert shown == want


def test_temporal_jigsaw_keeps_in_order_videos_among_its_answers(videos, tmp_path):
    """With 2 clips, both orders occur: the generator once never kept the identity (T-GRPO's
    shuffle must not), so every answer was "2,1" and could be given without looking."""
    recs = _records(GENERATORS.get("temporal_jigsaw")(tmp_path, source=str(videos), n_train=40,
                                                      n_eval=0, clips=2, frames_per_clip=2,
                                                      size=32))
    counts = {o: sum(r["solution"] == list(o) for r in recs) for o in ((1, 2), (2, 1))}
    assert min(counts.values()) >= 10, counts


def test_clip_counting_counts_the_joined_clips(videos, tmp_path):
    recs = _records(GENERATORS.get("clip_counting")(tmp_path, source=str(videos), n_train=12,
                                                    n_eval=0, max_clips=3, frames_per_clip=2,
                                                    size=32, align=2))
    # The frames each source gives (6 of its 8, evenly): every clip is a run of one of them.
    runs = {src.name: [_color_index(f) for f in _video_frames(src, 6, 32)]
            for src in videos.glob("*.mp4")}
    for r in recs:  # the same length whatever the count: the frame count must not tell it
        v = load_video(str(tmp_path / r["videos"][0]), nframes=999, max_frames=64, fps=None)
        assert len(v) == 6 and r["duration"] == 3.0
        # Cuts on Qwen's 2-frame temporal patches: 2 clips are 4 + 2 frames, never 3 + 3.
        assert len(r["cuts"]) == int(r["solution"]) - 1
        assert all(c % 2 == 0 for c in r["cuts"])
        shown = [_color_index(f) for f in v.frames]
        for a, b in zip([0, *r["cuts"]], [*r["cuts"], 6]):
            clip = shown[a:b]
            assert any(clip == run[s:s + len(clip)] for run in runs.values()
                       for s in range(7 - len(clip))), (r["id"], shown, r["cuts"])
    assert {r["solution"] for r in recs} == {"1", "2", "3"}
    assert {tuple(r["cuts"]) for r in recs if r["solution"] == "2"} == {(4,)}
    assert get_reward("count")([f"<answer>{r['solution']}</answer>" for r in recs],
                               [r["solution"] for r in recs]) == [1.0] * 12
    with pytest.raises(ValueError, match="align=1 for cuts anywhere"):
        GENERATORS.get("clip_counting")(tmp_path / "odd", source=str(videos), max_clips=3,
                                        frames_per_clip=1, align=2)
    one = _records(GENERATORS.get("clip_counting")(tmp_path / "any", source=str(videos), n_train=12,
                                                   n_eval=0, max_clips=3, frames_per_clip=2,
                                                   size=32))  # align=1, the default: anywhere
    assert {tuple(r["cuts"]) for r in one if r["solution"] == "2"} == {(3,)}
    # phase=1: every cut inside a temporal patch (odd frames), clips as near-equal as that allows.
    inside = _records(GENERATORS.get("clip_counting")(tmp_path / "in", source=str(videos),
                                                      n_train=24, n_eval=0, max_clips=3,
                                                      frames_per_clip=2, size=32, align=2,
                                                      phase=1))
    assert {tuple(r["cuts"]) for r in inside if r["solution"] == "2"} == {(3,)}
    assert {tuple(r["cuts"]) for r in inside if r["solution"] == "3"} == {(1, 3), (3, 5)}
    assert all(r["cuts"] == [] for r in inside if r["solution"] == "1")
    with pytest.raises(ValueError, match="phase=2 must be in 0..align-1"):
        GENERATORS.get("clip_counting")(tmp_path / "bad", source=str(videos), align=2, phase=2)


def test_bad_source_folders_fail_clearly(tmp_path, images):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        GENERATORS.get("rotation")(tmp_path / "out", source=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no videos"):
        GENERATORS.get("temporal_jigsaw")(tmp_path / "out", source=str(images))
