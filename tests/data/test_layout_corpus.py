"""Data layouts as their own projects document them, each through the path `mmrl train` takes up
to the first prompt features (load -> Sample -> prepare -> start checks -> decode -> processor):
each either reaches the processor with every media item it holds counted, or stops at start with
one line that names the record and the fix. None trains without its media (issue #55's rule).

Every layout also goes through `mmrl data inspect` (with and without the config's checks): the
same format, and the same message. A handful train 2 real steps on the tiny models."""
from __future__ import annotations

import base64
import io
import json
import tarfile
import types
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import yaml
from PIL import Image

from mmrl import config
from mmrl.data.media import processor_errors
from mmrl.data.media_errors import MediaError, RecordError
from mmrl.data.prepare import build_datasets, check_datasets, media_loader
from mmrl.data.synthetic_av import write_audio, write_mp4
from mmrl.models import get_adapter

VL, AUDIO = "qwen2_5_vl", "qwen2_audio"
FAMILY_TINY = {VL: {"min_pixels": 3136, "max_pixels": 3136}, AUDIO: {}}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """Small real media files, and their bytes for the embedded layouts."""
    d = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    for name, colour in (("a.png", (200, 30, 30)), ("b.png", (30, 30, 200))):
        im = np.full((56, 56, 3), 255, np.uint8)
        im[10:30, 12:40] = colour
        Image.fromarray(im).save(d / name)
    photo = io.BytesIO()  # noise does not compress: 150x150 RGB is a ~66 KB PNG
    Image.fromarray(rng.integers(0, 256, (150, 150, 3), dtype=np.uint8)).save(photo, "PNG")
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000).astype(np.float32)
    sf.write(d / "tone.wav", tone, 16000, subtype="PCM_16")
    sf.write(d / "tone.flac", tone, 16000)
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    for t in range(8):
        frames[t, 20:36, 4 + 5 * t:20 + 5 * t] = (220, 40, 40)
    write_mp4(d / "clip.mp4", frames, 4)
    write_audio(d / "tone.mp3", tone, 16000)
    with av.open(str(d / "clip.mkv"), "w") as container:  # another container, as Video-R1 ships
        stream = container.add_stream("libx264", rate=4, options={"preset": "veryfast"})
        stream.width = stream.height = 56
        stream.pix_fmt = "yuv420p"
        for k, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts = k
            container.mux(stream.encode(vf))
        container.mux(stream.encode())
    b64 = {n: base64.b64encode((d / n).read_bytes()).decode()
           for n in ("a.png", "tone.wav", "tone.mp3")}
    return types.SimpleNamespace(
        dir=d, png=(d / "a.png").read_bytes(), wav=(d / "tone.wav").read_bytes(),
        flac=(d / "tone.flac").read_bytes(), tone=tone, photo=photo.getvalue(), b64=b64,
        photo_uri="data:image/png;base64," + base64.b64encode(photo.getvalue()).decode())


def _chat(user, answer="3", **extra):
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": answer}], **extra}


def _conv(*turns, **extra):
    return {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": v}
                              for i, v in enumerate(turns)], **extra}


Q = "How many red squares are there?"
# name -> (origin, file kind, data.format, family, record(media), expected)
# expected: {"images": n, ...} counted in the features, or the stop message's telling part.
LAYOUTS = {
    # mmrl's native schema (docs/data.md)
    "native images list": ("mmrl", "jsonl", None, VL,
                           lambda m: {"prompt": Q, "images": ["a.png"], "solution": "1"},
                           {"images": 1}),
    "native singular image": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": Q, "image": "a.png", "solution": "1"},
                              {"images": 1}),
    "native singular audio": ("mmrl", "jsonl", "mmrl", AUDIO,
                              lambda m: {"prompt": "What is it?", "audio": "tone.flac",
                                         "solution": "a tone"}, {"audios": 1}),
    "native singular video": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": "Which way?", "video": "clip.mp4",
                                         "solution": "right"}, {"videos": 1}),
    "native <image> marks": ("mmrl", "jsonl", None, VL,
                             lambda m: {"prompt": "Left <image> right <image>: same colour?",
                                        "images": ["a.png", "b.png"], "solution": "no"},
                             {"images": 2}),
    "native marks != items": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": "<image><image>" + Q, "images": ["a.png"],
                                         "solution": "1"}, "2 <image> mark(s)"),
    "native 65 KB data URI": ("OpenAI / browsers", "jsonl", None, VL,
                              lambda m: {"prompt": Q, "images": [m.photo_uri], "solution": "0"},
                              {"images": 1}),
    "native file:// URL": ("RFC 8089", "jsonl", None, VL,
                           lambda m: {"prompt": Q, "images": [(m.dir / "a.png").as_uri()],
                                      "solution": "1"}, {"images": 1}),
    "native https offline": ("web", "jsonl", None, VL,
                             lambda m: {"prompt": Q, "images": ["https://example.com/a.png"],
                                        "solution": "1"}, "fetching is off (HF_HUB_OFFLINE"),
    "native corrupt base64": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": Q, "images": ["data:image/png;base64,@@@@"],
                                         "solution": "1"}, "base64 that does not decode"),
    "native image_path key": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": Q, "image_path": "a.png", "solution": "1"},
                              "rename 'image_path' to 'images'"),
    "native Qwen vision tokens": ("Qwen chat template", "jsonl", None, VL,
                                  lambda m: {"prompt": "<|vision_start|><|image_pad|>"
                                             "<|vision_end|>" + Q, "images": ["a.png"],
                                             "solution": "1"}, "<|vision_start|>"),
    "native mp3 data URI": ("mmrl", "jsonl", None, AUDIO,
                            lambda m: {"prompt": "What is it?", "audio": "data:audio/mpeg;base64,"
                                       + m.b64["tone.mp3"], "solution": "a tone"},
                            {"audios": 1}),
    "native options column": ("MMBench-style", "jsonl", None, VL,
                              lambda m: {"prompt": "Which colour is the square?", "images":
                                         ["a.png"], "options": ["red", "blue"], "solution": "A"},
                              {"images": 1}),
    "native wrapped answer": ("mmrl", "jsonl", None, VL,
                              lambda m: {"prompt": Q, "images": ["a.png"],
                                         "solution": "<answer>1</answer>"}, {"images": 1}),
    "native text only": ("a user's own keys", "jsonl", None, VL,
                         lambda m: {"prompt": Q, "img": "a.png", "solution": "1"},
                         "would train text-only"),
    "native audio transcript": ("mmrl", "jsonl", None, AUDIO,
                                lambda m: {"prompt": "Transcribe.", "audios": ["tone.wav"],
                                           "transcript": "a tone"}, {"audios": 1}),
    # ms-swift (docs: custom dataset; images as paths, base64 or {"path"} dicts)
    "ms-swift raw base64": ("ms-swift", "jsonl", None, VL,
                            lambda m: _chat("<image>" + Q, images=[m.b64["a.png"]]),
                            {"images": 1}),
    "ms-swift path dicts": ("ms-swift", "jsonl", None, VL,
                            lambda m: _chat("<image>" + Q, images=[{"path": "a.png"}]),
                            {"images": 1}),
    "ms-swift audios": ("ms-swift", "jsonl", None, AUDIO,
                        lambda m: _chat("<audio>What is it?", "a tone", audios=["tone.wav"]),
                        {"audios": 1}),
    # OpenAI chat completions content parts
    "OpenAI image_url data URI": ("OpenAI chat", "jsonl", None, VL,
                                  lambda m: _chat([{"type": "text", "text": Q},
                                                   {"type": "image_url",
                                                    "image_url": {"url": m.photo_uri}}]),
                                  {"images": 1}),
    "OpenAI image_url https offline": ("OpenAI chat", "jsonl", None, VL,
                                       lambda m: _chat([{"type": "image_url", "image_url":
                                                         {"url": "https://example.com/x.jpg"}},
                                                        {"type": "text", "text": Q}]),
                                       "https://example.com/x.jpg is a URL"),
    "OpenAI input_audio": ("OpenAI chat", "jsonl", None, AUDIO,
                           lambda m: _chat([{"type": "input_audio", "input_audio":
                                             {"data": m.b64["tone.wav"], "format": "wav"}},
                                            {"type": "text", "text": "What is it?"}], "a tone"),
                           {"audios": 1}),
    # HF chat / LLaMA-Factory
    "HF messages image parts": ("HF chat templates", "jsonl", None, VL,
                                lambda m: _chat([{"type": "image"}, {"type": "text", "text": Q}],
                                                images=["a.png"]), {"images": 1}),
    "HF part carrying its path": ("HF chat templates", "jsonl", None, VL,
                                  lambda m: _chat([{"type": "image", "image": "a.png"},
                                                   {"type": "text", "text": Q}]), {"images": 1}),
    "LLaMA-Factory <image> list": ("LLaMA-Factory", "json", None, VL,
                                   lambda m: _chat("<image>" + Q, images=["a.png"]),
                                   {"images": 1}),
    "messages multi-round": ("HF chat templates", "jsonl", None, VL,
                             lambda m: {"messages": [
                                 {"role": "user", "content": "<image>What is it?"},
                                 {"role": "assistant", "content": "A square."},
                                 {"role": "user", "content": Q},
                                 {"role": "assistant", "content": "1"}], "images": ["a.png"]},
                             {"images": 1}),
    # HF datasets Image / Audio columns (Parquet, as push_to_hub writes them)
    "HF Image column bytes": ("HF datasets", "parquet", None, VL,
                              lambda m: {"prompt": Q, "images": [{"bytes": m.png,
                                                                  "path": "a.png"}],
                                         "solution": "1"}, {"images": 1}),
    "HF Audio column bytes": ("HF datasets", "parquet", None, AUDIO,
                              lambda m: {"prompt": "What is it?", "audios": [{"bytes": m.flac,
                                                                              "path": None}],
                                         "solution": "a tone"}, {"audios": 1}),
    "HF Audio decoded array": ("HF datasets", "jsonl", None, AUDIO,
                               lambda m: {"prompt": "What is it?", "audio": {
                                   "array": m.tone.tolist(), "sampling_rate": 16000},
                                   "solution": "a tone"}, {"audios": 1}),
    # LLaVA / ShareGPT / InternVL
    "LLaVA conversations": ("LLaVA", "json", None, VL,
                            lambda m: _conv("<image>\n" + Q, "1", image="a.png", id="x"),
                            {"images": 1}),
    "InternVL multi-round": ("InternVL", "jsonl", None, VL,
                             lambda m: _conv("<image>\nWhat is it?", "A square.", Q, "1",
                                             image="a.png"), {"images": 1}),
    "InternVL multi-image": ("InternVL", "jsonl", None, VL,
                             lambda m: _conv("Image-1: <image>\nImage-2: <image>\nSame colour?",
                                             "no", image=["a.png", "b.png"]), {"images": 2}),
    "InternVL video": ("InternVL", "jsonl", None, VL,
                       lambda m: _conv("<video>\nWhich way?", "right", video="clip.mp4"),
                       {"videos": 1}),
    "ShareGPT data.format=sharegpt": ("ShareGPT", "jsonl", "sharegpt", VL,
                                      lambda m: _conv("<image>" + Q, "1", images=["a.png"]),
                                      {"images": 1}),
    "LLaVA with an audio key": ("LLaVA + audio", "jsonl", None, VL,
                                lambda m: _conv("<image>" + Q, "1", image="a.png",
                                                audio="tone.wav"),
                                "'audio' holds media that format vlm_r1 does not read"),
    # The anchors' own formats
    "VLM-R1 rec": ("VLM-R1", "jsonl", None, VL,
                   lambda m: _conv("<image>Where is the square?", "[12, 10, 40, 30]",
                                   image="a.png", accu_reward_method="iou"), {"images": 1}),
    "R1-V": ("R1-V", "jsonl", None, VL,
             lambda m: {"problem": Q, "solution": "<answer> 1 </answer>", "image": "a.png"},
             {"images": 1}),
    "EasyR1 jsonl": ("EasyR1", "jsonl", None, VL,
                     lambda m: {"problem": "<image>" + Q, "answer": "1", "images": ["a.png"]},
                     {"images": 1}),
    "EasyR1 choices column": ("EasyR1", "jsonl", None, VL,
                              lambda m: {"problem": "<image>Which colour?", "answer": "A",
                                         "choices": ["red", "blue"], "images": ["a.png"]},
                              {"images": 1}),
    "EasyR1 parquet bytes": ("EasyR1", "parquet", None, VL,
                             lambda m: {"problem": "<image>" + Q, "answer": "1",
                                        "images": [{"bytes": m.png, "path": None}]},
                             {"images": 1}),
    "Video-R1 video": ("Video-R1", "json", None, VL,
                       lambda m: {"problem_type": "multiple choice", "problem": "Which way?",
                                  "options": ["A. left", "B. right"],
                                  "solution": "<answer>B</answer>", "path": "clip.mp4",
                                  "data_type": "video"}, {"videos": 1}),
    "Video-R1 mkv": ("Video-R1", "json", None, VL,
                     lambda m: {"problem_type": "numerical", "problem": "How many squares?",
                                "solution": "<answer>1</answer>", "path": "clip.mkv",
                                "data_type": "video"}, {"videos": 1}),
    "Video-R1 image": ("Video-R1", "json", None, VL,
                       lambda m: {"problem_type": "numerical", "problem": Q,
                                  "solution": "<answer>1</answer>", "path": "a.png",
                                  "data_type": "image"}, {"images": 1}),
    "R1-AQA AVQA": ("R1-AQA", "jsonl", None, AUDIO,
                    lambda m: {"audio_path": "tone.wav", "question_text": "What is heard?",
                               "multi_choice": ["a tone", "a voice"], "answer": 0,
                               "dataset_name": "AVQA"}, {"audios": 1}),
    "R1-AQA MMAU": ("MMAU", "jsonl", None, AUDIO,
                    lambda m: {"audio_id": "tone.wav", "question": "What is heard?",
                               "choices": ["a tone", "a voice"], "answer": "a tone",
                               "task": "sound"}, {"audios": 1}),
    "R1-AQA with an image key": ("R1-AQA + image", "jsonl", None, AUDIO,
                                 lambda m: {"audio_path": "tone.wav", "question_text": "What?",
                                            "multi_choice": ["a", "b"], "answer": 0,
                                            "image": "a.png"},
                                 "'image' holds media that format r1_aqa does not read"),
    "Time-R1": ("Time-R1", "jsonl", None, VL,
                lambda m: {"video": "clip.mp4", "duration": 2.0, "timestamp": [0.5, 1.5],
                           "sentence": "the square moves"}, {"videos": 1}),
    # Speech recognition sets
    "LibriSpeech parquet": ("LibriSpeech (HF)", "parquet", "mmrl", AUDIO,
                            lambda m: {"file": "x.flac", "audio": {"bytes": m.flac,
                                                                   "path": "x.flac"},
                                       "text": "A TONE", "speaker_id": 1, "id": "1-2-3"},
                            {"audios": 1}),
    "LibriSpeech jsonl": ("LibriSpeech", "jsonl", None, AUDIO,
                          lambda m: {"audio": "tone.flac", "text": "a tone"}, {"audios": 1}),
    "NeMo manifest": ("NeMo", "jsonl", None, AUDIO,
                      lambda m: {"audio_filepath": "tone.wav", "text": "a tone",
                                 "duration": 0.5}, {"audios": 1}),
    "Common Voice": ("Common Voice (HF)", "jsonl", None, AUDIO,
                     lambda m: {"path": "tone.wav", "audio": "tone.wav",
                                "sentence": "a tone"}, {"audios": 1}),
    # WebDataset shards: key.json beside its media members (`__members__`: ext -> bytes)
    "WebDataset unnamed png": ("WebDataset", "tar", None, VL,
                               lambda m: {"prompt": Q, "solution": "1",
                                          "__members__": {"png": m.png}}, {"images": 1}),
    "WebDataset singular image names member": (
        "WebDataset", "tar", None, VL,
        lambda m: {"prompt": Q, "image": "png", "solution": "1",
                   "__members__": {"png": m.png}}, {"images": 1}),
    "WebDataset VLM-R1 shard": ("WebDataset", "tar", None, VL,
                                lambda m: _chat("<image>" + Q, "1", image="png",
                                                __members__={"png": m.png}), {"images": 1}),
    "WebDataset wav in an image format": (
        "WebDataset", "tar", None, VL,
        lambda m: _chat("<image>" + Q, "1", image="png",
                        __members__={"png": m.png, "wav": m.wav}), "does not read (it reads images and videos)"),
    "WebDataset flac for an audio model": (
        "WebDataset", "tar", None, AUDIO,
        lambda m: {"prompt": "What is it?", "solution": "a tone",
                   "__members__": {"flac": m.flac}}, {"audios": 1}),
}


def write_layout(name: str, media, folder: Path) -> Path:
    """The layout's file (two identical records) in `folder`, next to its media."""
    _, kind, _, _, record, _ = LAYOUTS[name]
    rows = [record(media), record(media)]
    folder.mkdir(parents=True, exist_ok=True)
    for f in media.dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    path = folder / f"train.{kind}"
    if kind == "tar":  # one sample per record: key.json and its members, as TarWriter writes
        with tarfile.open(path, "w") as tf:
            for k, row in enumerate(rows):
                extra = row.pop("__members__")
                members = {"json": json.dumps(row).encode(), **extra}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{k:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def layout_config(name: str, path: Path, run_dir: Path, **extra) -> config.RunConfig:
    _, _, fmt, family, _, _ = LAYOUTS[name]
    cfg = {"data": {"train": str(path), "format": fmt, "generate": None},
           "model": {"family": family, "path": "tiny", "tiny": FAMILY_TINY[family]},
           "rollout": {"prompts_per_step": 2, "num_generations": 2, "max_new_tokens": 4},
           "rewards": [{"name": "mmrl_test_rewards:char_variety"}],
           "train": {"steps": 2, "micro_batch_size": 4, "save_every": 0},
           "eval": {"before_rl": False},
           "log": {"run_dir": str(run_dir), "progress": "off", "tensorboard": False,
                   "rollouts_every": 0}}
    for section, values in extra.items():
        cfg[section].update(values)
    (run_dir.parent / "layout.yaml").write_text(yaml.safe_dump(cfg))
    return config.load(run_dir.parent / "layout.yaml")


@pytest.fixture(scope="module")
def processors(user_rewards):
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = get_adapter(family).tiny(**FAMILY_TINY[family])[1]
        return cache[family]
    return get


def first_features(cfg: config.RunConfig, processor):
    """What `mmrl train` does up to its first prompt's features: build_datasets, the start
    checks, the media loader and the processor call -> (format, sample, features)."""
    adapter = get_adapter(cfg.model.family)
    train, _ = build_datasets(cfg, adapter.image_factor)
    check_datasets(cfg, train, None, adapter.media_kinds)
    sample = train[0]
    media = media_loader(cfg, adapter.image_factor)(sample)
    with processor_errors(sample):
        feats = adapter.prompt_features(processor, sample, **media)
    return train.format, sample, feats


def counted(feats) -> dict[str, int]:
    t = feats.tensors
    out = {"images": len(t["image_grid_thw"]) if "image_grid_thw" in t else 0,
           "videos": len(t["video_grid_thw"]) if "video_grid_thw" in t else 0,
           "audios": len(t["input_features"]) if "input_features" in t else 0}
    return {k: v for k, v in out.items() if v}


def _inspect_messages(path: Path, cfg) -> tuple[str, list[str]]:
    """(format, every message) of `mmrl data inspect FILE --config CONFIG` on the file."""
    from mmrl.cli_data import _config_checks
    from mmrl.data.inspect import inspect_file

    report = inspect_file(path, configured=cfg.data.format)
    said = [*report["bad_records"], *(m["error"] for m in report["bad_media"])]
    if report["records"] and not said:
        args = types.SimpleNamespace(file=str(path), media_root=None)
        said += _config_checks(args, None, cfg)[0]
    return report["format"], said


def outcome(name: str, media, tmp_path: Path, processors):
    """(format or None, sample or None, features or None, the stop message or None)."""
    path = write_layout(name, media, tmp_path / "data")
    cfg = layout_config(name, path, tmp_path / "run")
    try:
        fmt, sample, feats = first_features(cfg, processors(cfg.model.family))
    except (RecordError, MediaError, ValueError) as e:
        return None, None, None, str(e)
    return fmt, sample, feats, None


def test_the_corpus_has_thirty_layouts_from_a_dozen_projects():
    assert len(LAYOUTS) >= 30
    assert len({origin for origin, *_ in LAYOUTS.values()}) >= 12


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_reaches_the_processor_with_its_media_or_stops_and_inspect_agrees(
        name, media, tmp_path, processors, monkeypatch):
    """Train's path, then `mmrl data inspect` (and its --config checks) on the same file: the
    same format, and train's stop message among inspect's."""
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    expected = LAYOUTS[name][-1]
    fmt, sample, feats, stop = outcome(name, media, tmp_path, processors)
    shown, said = _inspect_messages(tmp_path / "data" / f"train.{LAYOUTS[name][1]}",
                                    config.load(tmp_path / "layout.yaml"))
    if isinstance(expected, str):
        assert stop is not None, f"{name} trained ({fmt}): expected to stop with {expected!r}"
        assert expected in stop and "\n" not in stop, stop
        assert "train." in stop.split(":", 1)[0] or "training records" in stop, stop  # names file
        assert stop in said, (stop, said)
        return
    assert stop is None, f"{name} stopped: {stop}"
    assert counted(feats) == expected, (name, fmt, counted(feats))
    # the media the record holds are the sample's, every one (none silently dropped)
    assert {k: len(getattr(sample, k)) for k in expected} == expected
    assert shown == fmt and said == [], (shown, said)


def test_what_the_layouts_mean_reaches_the_prompt(media, tmp_path, processors, monkeypatch):
    """Marks place media, options reach the prompt, a wrapped answer is unwrapped once, chats
    keep earlier rounds as history, transcripts are the answer, audio is never a .png."""
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))

    def sample(name):
        return outcome(name, media, tmp_path / name.replace(" ", "_"), processors)[1]

    marks = sample("native <image> marks").messages[0]["content"]
    assert [p["type"] for p in marks] == ["text", "image", "text", "image", "text"]
    text = sample("native options column").messages[0]["content"][-1]["text"]
    assert text.endswith("Options:\nA. red\nB. blue")
    text = sample("EasyR1 choices column").messages[0]["content"][-1]["text"]
    assert text.endswith("Options:\nA. red\nB. blue")
    assert sample("native wrapped answer").solution == "1"
    for name in ("messages multi-round", "InternVL multi-round"):
        s = sample(name)
        assert [m["role"] for m in s.messages] == ["user", "assistant", "user"], name
        assert s.solution == "1"
    assert sample("LibriSpeech parquet").solution == "A TONE"
    assert sample("native audio transcript").solution == "a tone"
    for name in ("HF Audio column bytes", "HF Audio decoded array", "OpenAI input_audio"):
        assert Path(sample(name).audios[0]).suffix in (".flac", ".wav"), name


@pytest.mark.parametrize("name", ["native 65 KB data URI", "InternVL multi-round",
                                  "LibriSpeech parquet"])
def test_layouts_train_two_steps(name, media, tmp_path, user_rewards, monkeypatch):
    from mmrl.train.run import train

    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    path = write_layout(name, media, tmp_path / "data")
    summary = train(layout_config(name, path, tmp_path / "run"))
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows if "loss/loss" in r] == [1, 2]


def test_a_bad_embedded_item_is_skipped_and_counted_under_the_skip_policy(media, tmp_path,
                                                                         user_rewards,
                                                                         monkeypatch):
    from mmrl.train.run import train

    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    good = LAYOUTS["native 65 KB data URI"][4](media)
    bad = {**good, "images": ["data:image/png;base64,@@@@"]}
    path = tmp_path / "data" / "train.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in (good, good, bad, good)))
    summary = train(layout_config("native 65 KB data URI", path, tmp_path / "run",
                                  data={"on_bad_sample": "skip"}))
    assert summary["steps"] == 2
    skipped = json.loads((tmp_path / "run" / "summary.json").read_text())["skipped_records"]
    assert skipped["count"] >= 1
    assert skipped["first"][0].startswith(f"{path}:3: 'images': base64 that does not decode")
