"""Media that would crash or exhaust a run is refused before decoding, as a MediaError naming
the record and the file (so data.on_bad_sample=skip covers it), and `data inspect` finds it:
an image over the decode limit or over Pillow's bomb limit, audio too short for Qwen2-Audio.
A large JPEG decodes reduced instead of at full size."""
from __future__ import annotations

import json
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from mmrl.bench.common import peak_rss_bytes, reset_peak_rss
from mmrl.data.inspect import inspect_file
from mmrl.data.media import MediaError, decode_limit, fit_image, load_audio, load_image


def _peak_mb() -> float:
    return peak_rss_bytes() / 2**20


def test_huge_png_is_refused_from_its_header_without_decoding(tmp_path):
    path = tmp_path / "huge.png"
    Image.new("1", (12000, 12000)).save(path)  # 1 bit per pixel: small to build, 144 MP
    reset_peak_rss()  # the peak of this step alone, not of the tests before it
    before = _peak_mb()
    with pytest.raises(MediaError) as e:
        load_image(str(path), "d.jsonl:3", max_pixels=1_000_000)
    assert _peak_mb() - before < 200  # decoding it as RGB would take 432 MB and more
    assert str(e.value) == (f"d.jsonl:3: image {path}: 12000x12000 is 144 MP, over the 16 MP a run "
                            f"decodes (max(4 x data.image_max_pixels, 16 MP)): downscale the "
                            f"file, or raise data.image_max_pixels")
    assert decode_limit(None) == 4 * 16384 * 28 * 28  # Qwen's default budget when none is set


def test_image_over_pillows_bomb_limit_is_a_media_error(tmp_path):
    path = tmp_path / "bomb.png"
    Image.new("1", (20000, 20000)).save(path)  # 400 MP: Image.open itself refuses it
    with pytest.raises(MediaError, match=r"^d.jsonl:9: image .*bomb.png: Image size \(400000000 "
                                         r"pixels\) exceeds limit.*Downscale the file"):
        load_image(str(path), "d.jsonl:9")


def test_large_jpeg_decodes_reduced_and_still_covers_the_budget(tmp_path):
    path = tmp_path / "photo.jpg"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8)).save(path)
    budget = 250_000
    im = load_image(str(path), max_pixels=budget)
    assert im.size == (1000, 750)  # the 1/4 DCT scale: 1/8 (500x375) would fall under it
    assert im.size[0] * im.size[1] >= budget
    full = fit_image(Image.open(path).convert("RGB"), None, budget)
    assert fit_image(im, None, budget).size == full.size  # the model sees the same frame size


def test_too_short_audio_is_refused_and_inspect_finds_it(tmp_path):
    sf.write(tmp_path / "blip.wav", np.zeros(800, np.float32), 16000)  # 50 ms
    sf.write(tmp_path / "word.wav", np.zeros(4000, np.float32), 16000)  # 250 ms
    with pytest.raises(MediaError, match=r"^a.jsonl:1: audio .*blip.wav: 50 ms of audio is shorter "
                                         r"than the 100 ms the audio models take"):
        load_audio(str(tmp_path / "blip.wav"), source="a.jsonl:1")
    assert load_audio(str(tmp_path / "word.wav")).shape == (4000,)
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"prompt": "What is said?", "solution": "x", "audios": [a]})
                            + "\n" for a in ("word.wav", "blip.wav")))
    for deep in (False, True):
        bad = inspect_file(data, deep=deep)["bad_media"]
        assert [m["source"] for m in bad] == [f"{data}:2"], (deep, bad)
        assert "50 ms of audio is shorter than the 100 ms" in bad[0]["error"]
