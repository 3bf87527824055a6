"""A video given as a folder of extracted frames: sorted image files read as a video at the rate
the record (frame_fps) or the folder (fps.txt) gives; a folder without frames, or of an unknown
rate, is a message that says so."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mmrl.data.inspect import inspect_file
from mmrl.data.media import MediaError, load_media, load_video
from mmrl.data.schema import load_samples


def _frames(folder, n, size=(32, 24)):
    folder.mkdir(parents=True)
    for i in range(n):  # frame_10 after frame_9: natural order, not the string order
        Image.new("RGB", size, (i * 20, 0, 0)).save(folder / f"frame_{i}.jpg", quality=100)
    return folder


def test_a_frame_folder_is_read_as_a_video_at_the_records_rate(tmp_path):
    folder = _frames(tmp_path / "clip", 12)
    video = load_video(str(folder), fps=2.0, frame_fps=4.0)
    # 12 frames at 4 fps = 3 s; 2 fps samples 6 frames: qwen-vl-utils' rule on 12 frames.
    assert video.duration == 3.0 and len(video) == 6 and video.fps == 2.0
    assert video.frames.shape == (6, 24, 32, 3)
    reds = [int(f[..., 0].mean()) for f in video.frames]
    assert reds == sorted(reds) and abs(reds[-1] - 220) <= 2  # ends on frame_11


def test_the_rate_comes_from_fps_txt_and_records_reach_it_through_load_media(tmp_path):
    folder = _frames(tmp_path / "clip", 8)
    (folder / "fps.txt").write_text("2\n")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "What happens?", "videos": ["clip"],
                                "solution": "A"}) + "\n")
    (sample,) = load_samples(path)
    (video,) = load_media(sample, video_kwargs={"fps": 1.0})["videos"]
    assert video.duration == 4.0 and len(video) == 4
    assert inspect_file(path)["bad_media"] == []


def test_a_folder_without_frames_or_rate_says_what_to_do(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MediaError, match=r"d.jsonl:1: video .*empty: a folder with no frames"):
        load_video(str(tmp_path / "empty"), source="d.jsonl:1")
    _frames(tmp_path / "clip", 4)
    with pytest.raises(MediaError, match=r"unknown rate: give the record a 'frame_fps' field"):
        load_video(str(tmp_path / "clip"))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "Q?", "videos": ["empty"], "solution": "A"}) + "\n"
                    + json.dumps({"prompt": "Q?", "images": ["clip"], "solution": "A"}) + "\n")
    errors = [m["error"] for m in inspect_file(path)["bad_media"]]
    assert "a folder with no frames" in errors[0] and "is a folder, not a file" in errors[1]
    assert not any("file not found" in e for e in errors)
