"""The built-in tools on real files: crop maps a box from the model's input frame to the
original (hand-computed), enlarges boxes under one merged patch, comes back under the budget,
and refuses boxes outside the image; frames and audio_clip cut the original at the asked span
and refuse spans outside the clip."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmrl.data.media import fit_image, load_audio
from mmrl.data.synthetic_av import write_mp4, write_wav
from mmrl.models import get_adapter
from mmrl.tools import ToolContext, ToolInputError
from mmrl.tools.builtin import audio_clip, clamp_box, crop, enlarge, frames
from mmrl.types import PromptFeatures, Sample

BUDGET = (28 * 28, 28 * 28 * 16)


def context(tmp_path, image=None, input_size=(200, 150), videos=(), audios=()) -> ToolContext:
    images = []
    if image is not None:
        image.save(tmp_path / "orig.png")
        images = [str(tmp_path / "orig.png")]
    prompt = PromptFeatures(sample=Sample(id="s", messages=[], source="t.jsonl:1"), tensors={})
    return ToolContext(prompt=prompt, input_sizes=[input_size], images=images, videos=list(videos),
                       audios=list(audios), image_pixels=BUDGET)


def gradient(w: int, h: int) -> Image.Image:
    """Pixel (x, y) = (x mod 256, y mod 256, (x // 256) * 16): every position tells itself."""
    x, y = np.meshgrid(np.arange(w), np.arange(h))
    return Image.fromarray(np.stack([x % 256, y % 256, (x // 256) * 16], -1).astype(np.uint8))


def test_crop_maps_the_input_frame_box_to_the_original(tmp_path):
    original = gradient(400, 300)  # the model saw it at 200 x 150: scale 2
    ctx = context(tmp_path, original)
    (out,) = crop(ctx, [10, 20, 60, 70])
    expected = fit_image(original.crop((20, 40, 120, 140)), *BUDGET)
    assert np.array_equal(np.asarray(out), np.asarray(expected))
    assert out.size == (112, 112)  # 100 x 100 under 28*28..28*28*16 rounds to 112 x 112
    # norm1000 (Qwen2-VL / Qwen3-VL) boxes: [250, 250, 500, 500] of 400 x 300 -> (100, 75, 200, 150)
    expected = np.asarray(fit_image(original.crop((100, 75, 200, 150)), *BUDGET))
    (norm,) = crop(ctx, [250, 250, 500, 500], coords="norm1000")
    assert np.array_equal(np.asarray(norm), expected)
    ctx.coords = get_adapter("qwen3_vl").box_coords  # the family's convention is the default
    assert np.array_equal(np.asarray(crop(ctx, [250, 250, 500, 500])[0]), expected)


def test_small_boxes_grow_to_one_merged_patch_inside_the_image():
    assert enlarge([100, 100, 102, 102], 28, 400, 300) == [87, 87, 115, 115]
    assert enlarge([0, 0, 2, 2], 28, 400, 300) == [0, 0, 28, 28]  # shifted in at the corner
    assert enlarge([398, 299, 400, 300], 28, 400, 300) == [372, 272, 400, 300]
    assert enlarge([5, 5, 50, 60], 28, 400, 300) == [5, 5, 50, 60]  # large enough: unchanged
    assert enlarge([1, 1, 3, 3], 28, 20, 10) == [0, 0, 20, 10]  # the image is smaller than 28


def test_crop_of_a_tiny_box_reads_the_original_at_full_resolution(tmp_path):
    original = gradient(400, 300)
    ctx = context(tmp_path, original)
    (out,) = crop(ctx, [50, 50, 51, 51])  # 2 x 2 original px -> grown to 28 x 28 around (101, 101)
    assert np.array_equal(np.asarray(out), np.asarray(fit_image(original.crop((87, 87, 115, 115)),
                                                                *BUDGET)))


def test_boxes_outside_the_image_or_reversed_are_refused(tmp_path):
    ctx = context(tmp_path, gradient(400, 300))
    for box, message in [([210, 0, 300, 50], "outside the image"), ([50, 50, 10, 60], "reversed"),
                         ([5, 5, 5, 9], "empty")]:
        with pytest.raises(ToolInputError, match=message) as e:
            crop(ctx, box)
        assert e.value.kind == "bad_box"
    assert clamp_box([-5, -5, 20, 20], 200, 150) == [0, 0, 20, 20]  # overshoot is clamped
    for bad in ([1, 2, 3], [0, 0, float("nan"), 1], "1,2,3,4", [True, 0, 1, 1]):
        with pytest.raises(ToolInputError) as e:
            crop(ctx, bad)
        assert e.value.kind == "bad_arguments"
    for index in (2, 0, 1.5, float("nan"), "1"):
        with pytest.raises(ToolInputError, match="image must be 1..1"):
            crop(ctx, [0, 0, 10, 10], image=index)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """8 s at 4 fps; frame k is grey level 8 * k, so each frame tells its index."""
    path = tmp_path_factory.mktemp("v") / "clip.mp4"
    frames_ = np.stack([np.full((32, 32, 3), 8 * k, np.uint8) for k in range(32)])
    write_mp4(path, frames_, 4)
    return str(path)


def test_frames_returns_the_span_at_a_higher_fps(tmp_path, video):
    ctx = context(tmp_path, videos=[video])
    clip, caption = frames(ctx, 2, 4, fps=2.0)
    assert clip.timestamps[0] >= 2.0 and clip.timestamps[-1] <= 4.0
    levels = clip.frames.reshape(len(clip), -1).mean(1) / 8
    assert np.allclose(levels, np.asarray(clip.timestamps) * 4, atol=1)  # the frames of the span
    assert clip.fps == pytest.approx(2.0, rel=0.2) and "2-4 s" in caption
    dense, _ = frames(ctx, 2, 4, fps=4.0)
    assert len(dense) > len(clip)


def test_frames_refuses_spans_outside_the_video(tmp_path, video):
    ctx = context(tmp_path, videos=[video])
    for span in [(-1, 2), (3, 2), (7, 9), (2, 2)]:
        with pytest.raises(ToolInputError, match="not inside the video") as e:
            frames(ctx, *span)
        assert e.value.kind == "bad_span"


def test_audio_clip_cuts_the_original(tmp_path):
    sr = 16000
    wave = np.sin(np.arange(2 * sr) * 2 * np.pi * 440 / sr).astype(np.float32) * 0.5
    write_wav(tmp_path / "a.wav", wave, sr)
    ctx = context(tmp_path, audios=[str(tmp_path / "a.wav")])
    clip, caption = audio_clip(ctx, 0.5, 1.0)
    original = load_audio(str(tmp_path / "a.wav"))
    assert clip.shape == (8000,) and np.array_equal(clip, original[8000:16000])
    assert caption == "audio 0.5-1 s"
    for span, message in [((1.5, 2.5), "not inside the audio"), ((1.0, 1.05), "shorter than 0.1")]:
        with pytest.raises(ToolInputError, match=message) as e:
            audio_clip(ctx, *span)
        assert e.value.kind == "bad_span"


def test_a_group_resizes_and_decodes_a_repeated_call_once(tmp_path, video, monkeypatch):
    """The G trajectories of a group share a ToolContext; a policy that repeats its box or span
    gets the same pixels from one resize (one decode), equal to a fresh call's; another group
    (its own context) does its own, and a load that fails caches nothing."""
    import mmrl.tools.builtin as builtin

    calls = {"fit": 0, "video": 0}
    real_fit = builtin.fit_image
    for key, name in (("fit", "fit_image"), ("video", "load_video")):
        def counting(*a, _key=key, _real=getattr(builtin, name), **k):
            calls[_key] += 1
            return _real(*a, **k)
        monkeypatch.setattr(builtin, name, counting)
    original = gradient(400, 300)
    group = context(tmp_path, original, videos=[video])
    first, again = crop(group, [10, 20, 60, 70])[0], crop(group, [10, 20, 60, 70])[0]
    assert calls["fit"] == 1 and again is first
    assert np.array_equal(np.asarray(first), np.asarray(
        real_fit(original.crop((20, 40, 120, 140)), *BUDGET)))
    crop(group, [0, 0, 60, 70])  # another box: its own resize
    crop(context(tmp_path, original), [10, 20, 60, 70])  # another group: its own
    assert calls["fit"] == 3
    frames(group, 2, 4, fps=2.0)
    made = calls["video"]  # the duration probe and the span
    clip, _ = frames(group, 2, 4, fps=2.0)
    assert calls["video"] == made and len(clip) == len(frames(group, 2, 4, fps=4.0)[0]) // 2
    failing = {"n": 0}

    def fails():
        failing["n"] += 1
        raise OSError("unreadable")
    for _ in range(2):
        with pytest.raises(OSError):
            group.cached(("x",), fails)
    assert failing["n"] == 2 and group.cached(("x",), lambda: 5) == 5


def test_frames_set_above_the_records_frame_budget_come_back_whole(tmp_path, video):
    """A `frames` tool set to return more frames than a record's first look holds (the
    video_search layer: 8 frames of a span, data.video_max_frames 4) returns them: its own
    `max_frames` (given, or its default 16) is the frames guard of its results; over every
    tool's setting and the records' budget, a result is still refused."""
    from mmrl import config
    from mmrl.tools import ToolCall, Toolbox
    from mmrl.tools.base import as_items
    from mmrl.data.media import Video

    cfg = config.load(None, ["data.train=x", "data.video_max_frames=4",
                             "tools.use=[{name: frames, params: {fps: 4.0, max_frames: 8}}]"])
    box = Toolbox.from_config(cfg.tools, cfg.data)
    assert box.max_frames == 8
    ctx = context(tmp_path, videos=[video])
    ctx.max_frames = box.max_frames
    (out,) = box.run([(ToolCall("frames", {"start": 0, "end": 4}), ctx, ["frames"])])
    assert out.error is None, out.message
    assert [len(v) for v in out.items if isinstance(v, Video)] == [8]
    default = Toolbox.from_config(config.load(None, ["data.train=x", "data.video_max_frames=4",
                                                     "tools.use=[{name: frames}]"]).tools, cfg.data)
    assert default.max_frames == 16  # the tool's own default
    nine = Video(frames=np.zeros((9, 8, 8, 3), np.uint8), fps=1.0, timestamps=list(range(9)),
                 duration=9.0)
    with pytest.raises(TypeError, match="9 frames, over the 8"):
        as_items(nine, ctx.limits)
