"""Media items in every form a record holds them (mmrl/data/media_sources.py): fetched URLs
(against a local http.server on 127.0.0.1 only), the offline error, the suffix the bytes say,
strings that are neither path nor media, and the decode guards on embedded images."""
from __future__ import annotations

import base64
import functools
import http.server
import io
import json
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from mmrl.data.inspect import spread
from mmrl.data.media import load_image
from mmrl.data.media_errors import MediaError
from mmrl.data.media_sources import FETCH_ENV, resolve, sniff
from mmrl.data.schema import load_samples


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    return tmp_path / "embedded"


@pytest.fixture
def server(tmp_path):
    """A static file server on 127.0.0.1 serving tmp_path/www: (base URL, folder)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www
    httpd.shutdown()
    httpd.server_close()


def _png(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 0, 0)).save(buf, "PNG")
    return buf.getvalue()


def test_a_url_is_fetched_once_into_the_embedded_folder_and_reused_offline(
        server, embedded, monkeypatch):
    base, www = server
    (www / "pic").write_bytes(_png())  # no suffix in the URL: the bytes say PNG
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv(FETCH_ENV, raising=False)
    path = resolve(f"{base}/pic", Path("."), "d.jsonl:1", "images")
    assert Path(path).read_bytes() == _png() and path.endswith(".png")
    assert Path(path).parent == embedded / "fetched"
    (www / "pic").unlink()  # fetched once: the next run reads the copy, offline too
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve(f"{base}/pic", Path("."), "d.jsonl:2", "images") == path
    assert load_image(path).size == (8, 8)


def test_a_url_that_cannot_be_fetched_is_a_media_error_naming_record_and_url(server, embedded,
                                                                              monkeypatch):
    base, _ = server
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(MediaError, match=rf"^d.jsonl:4: 'image': cannot fetch {base}/gone.png: "
                                         rf"HTTP Error 404"):
        resolve(f"{base}/gone.png", Path("."), "d.jsonl:4", "image")


@pytest.mark.parametrize("env,value,why", [("HF_HUB_OFFLINE", "1", "HF_HUB_OFFLINE is set"),
                                           (FETCH_ENV, "0", f"{FETCH_ENV}=0")])
def test_offline_a_url_is_an_error_naming_it_and_the_setting(env, value, why, embedded,
                                                             monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(env, value)
    with pytest.raises(MediaError) as e:
        resolve("https://example.com/cat.jpg", Path("."), "d.jsonl:7", "images")
    assert str(e.value).startswith(f"d.jsonl:7: 'images': https://example.com/cat.jpg is a URL "
                                   f"and fetching is off ({why}): download it and give the "
                                   f"path, or unset HF_HUB_OFFLINE and {FETCH_ENV}")


def test_bytes_are_named_by_what_they_are_never_png_for_audio(embedded):
    wav = io.BytesIO()
    sf.write(wav, np.zeros(1600, np.float32), 16000, format="WAV")
    assert resolve({"bytes": wav.getvalue(), "path": None}, Path("."), "s", "audios") \
        .endswith(".wav")
    assert resolve(b"\x00\x01 not media", Path("."), "s", "audio").endswith(".bin")
    assert sniff(_png(), "image") == ".png" and sniff(b"\x00\x00\x00\x18ftypM4A ", "audio") == ".m4a"
    # a percent-encoded data URI, and a file URL with an escaped space
    text = resolve("data:text/plain,a%20b", Path("."), "s", "image")
    assert Path(text).read_bytes() == b"a b"
    assert resolve("file:///x/my%20pic.png", Path("."), "s", "image") == "/x/my pic.png"


def test_a_long_string_that_is_no_path_is_a_media_error_not_errno_36(tmp_path, embedded):
    with pytest.raises(MediaError, match=r"^d.jsonl:1: 'images': .* characters\) is not a path"):
        resolve("x" * 300 + ".png", tmp_path, "d.jsonl:1", "images")


def test_an_embedded_image_meets_the_decode_guard_before_it_is_decoded(tmp_path, embedded):
    huge = io.BytesIO()
    Image.new("1", (12000, 12000)).save(huge, "PNG")  # small bytes, 144 MP
    path = resolve("data:image/png;base64," + base64.b64encode(huge.getvalue()).decode(),
                   tmp_path, "d.jsonl:2", "images")
    with pytest.raises(MediaError, match=r"^d.jsonl:2: image .*: 12000x12000 is 144 MP, over"):
        load_image(path, "d.jsonl:2", max_pixels=1_000_000)


def test_a_bad_item_among_good_ones_is_left_to_the_skip_policy(tmp_path, embedded):
    """The start checks read past it; the draw raises a MediaError naming file:line, which
    data.on_bad_sample=skip counts (mmrl/train/prompts.py)."""
    good = {"prompt": "Q", "images": ["data:image/png;base64,"
                                      + base64.b64encode(_png()).decode()], "solution": "1"}
    bad = {**good, "images": ["data:image/png;base64,@@"]}
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (good, bad, good)))
    samples = load_samples(path)
    assert len(spread(samples)) == 2
    with pytest.raises(MediaError, match=rf"^{path}:2: 'images': base64 that does not decode"):
        samples[1]
    assert urllib.parse.urlparse(samples[0].images[0]).scheme == ""  # a local file
