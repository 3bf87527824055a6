"""MediaCache: a second epoch decodes nothing; changed files and parameters miss; torn entries heal."""
import os

import numpy as np
import pytest

from mmrl.data import audio as audio_mod, media
from mmrl.data.cache import MediaCache
from mmrl.data.media import MediaError, load_audio, load_media, load_video
from mmrl.data.synthetic_av import write_mp4, write_wav
from mmrl.types import Sample


@pytest.fixture()
def files(tmp_path):
    frames = np.stack([np.full((32, 32, 3), 20 * k, np.uint8) for k in range(8)])
    write_mp4(tmp_path / "v.mp4", frames, 4)
    write_wav(tmp_path / "a.wav", 0.2 * np.sin(np.arange(8000) / 5), 8000)
    return tmp_path


@pytest.fixture()
def calls(monkeypatch):
    """Count real decodes by wrapping the two decoders the loaders call."""
    counts = {"video": 0, "audio": 0}
    real_video, real_audio = media._decode_video, audio_mod._decode_audio

    def video(*a, **k):
        counts["video"] += 1
        return real_video(*a, **k)

    def audio(*a, **k):
        counts["audio"] += 1
        return real_audio(*a, **k)

    monkeypatch.setattr(media, "_decode_video", video)
    monkeypatch.setattr(audio_mod, "_decode_audio", audio)
    return counts


def test_second_epoch_decodes_nothing(files, calls, tmp_path):
    cache = MediaCache(tmp_path / "cache")
    sample = Sample(id="x", messages=[], videos=[str(files / "v.mp4")], audios=[str(files / "a.wav")],
                    source="d.jsonl:1")
    first = load_media(sample, video_kwargs={"nframes": 4}, cache=cache)
    assert calls == {"video": 1, "audio": 1} and (cache.hits, cache.misses) == (0, 2)
    for _ in range(3):
        again = load_media(sample, video_kwargs={"nframes": 4}, cache=cache)
    assert calls == {"video": 1, "audio": 1} and (cache.hits, cache.misses) == (6, 2)
    v0, v1 = first["videos"][0], again["videos"][0]
    assert np.array_equal(v0.frames, v1.frames) and v0.timestamps == v1.timestamps
    assert (v0.fps, v0.duration, v0.path) == (v1.fps, v1.duration, v1.path)
    assert np.array_equal(first["audios"][0], again["audios"][0])
    assert again["audios"][0].dtype == np.float32
    # A fresh cache object on the same root (next process, next epoch) hits too.
    load_media(sample, video_kwargs={"nframes": 4}, cache=MediaCache(tmp_path / "cache"))
    assert calls == {"video": 1, "audio": 1}


def test_parameters_and_file_identity_are_in_the_key(files, calls, tmp_path):
    cache = MediaCache(tmp_path / "cache")
    path = str(files / "v.mp4")
    load_video(path, nframes=4, cache=cache)
    load_video(path, nframes=2, cache=cache)
    load_video(path, nframes=4, start=0.5, cache=cache)
    assert calls["video"] == 3
    load_video(path, nframes=4, cache=cache)
    assert calls["video"] == 3
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file "changed"
    load_video(path, nframes=4, cache=cache)
    assert calls["video"] == 4


def test_truncation_is_counted_on_hits_too(files, tmp_path):
    cache, stats = MediaCache(tmp_path / "cache"), {}
    for _ in range(2):
        x = load_audio(str(files / "a.wav"), max_seconds=0.5, truncate="head", cache=cache,
                       stats=stats)
    assert len(x) == 8000 and stats == {"audio_truncated": 2} and cache.hits == 1


def test_torn_entry_is_a_miss_and_is_rewritten(files, calls, tmp_path):
    cache = MediaCache(tmp_path / "cache")
    path = str(files / "a.wav")
    load_audio(path, cache=cache)
    (entry,) = (tmp_path / "cache").glob("*/*.npz")
    entry.write_bytes(b"PK\x03\x04 torn")
    x = load_audio(path, cache=cache)
    assert calls["audio"] == 2 and len(x) == 16000
    load_audio(path, cache=cache)
    assert calls["audio"] == 2 and cache.stats()["files"] == 1


def test_errors_are_not_cached(files, tmp_path):
    cache = MediaCache(tmp_path / "cache")
    for _ in range(2):
        with pytest.raises(MediaError, match="no audio track"):
            load_audio(str(files / "v.mp4"), cache=cache)
    assert cache.stats()["files"] == 0 and cache.misses == 2
