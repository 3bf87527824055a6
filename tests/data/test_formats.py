"""Format adapters on hand-written records in each anchor project's own format, convert()
round trips, malformed records, and inspect_file."""
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.data import formats  # noqa: F401  (registers the adapters)
from mmrl.data.formats import convert
from mmrl.data.inspect import format_report, inspect_file, render_prompt
from mmrl.data.schema import FORMATS, RecordError, load_samples
from mmrl.data.synthetic_av import write_mp4

BASE = Path("/data/set")
SRC = "in.jsonl:3"


def adapt(fmt, record):
    return FORMATS.get(fmt)(record, SRC, BASE)


def content_types(sample):
    return [c["type"] for c in sample.messages[0]["content"]]


def text_of(sample):
    return " ".join(c["text"] for c in sample.messages[0]["content"] if c["type"] == "text")


# ---------------------------------------------------------------------------------- adapters ----

def test_vlm_r1_llava_conversations():
    s = adapt("vlm_r1", {
        "id": 1, "image": "clevr/0001.png",
        "conversations": [{"from": "human", "value": "<image>What number of purple balls are there?"},
                          {"from": "gpt", "value": "0"}]})
    assert s.id == "1" and s.images == ["/data/set/clevr/0001.png"] and s.solution == "0"
    assert content_types(s) == ["image", "text"] and s.task == "vqa" and s.source == SRC
    assert text_of(s) == "What number of purple balls are there?"


def test_vlm_r1_multi_image_and_box_answer():
    s = adapt("vlm_r1", {
        "image": ["a.png", "/abs/b.png"],
        "conversations": [{"from": "human", "value": "Compare <image> with <image>: where is the dog?"},
                          {"from": "gpt", "value": "<answer>[10, 20, 30.5, 40]</answer>"}],
        "accu_reward_method": "iou"})
    assert s.images == ["/data/set/a.png", "/abs/b.png"]
    assert content_types(s) == ["text", "image", "text", "image", "text"]
    assert s.solution == [10.0, 20.0, 30.5, 40.0] and s.task == "detection"
    assert s.fields == {"accu_reward_method": "iou"}


def test_r1v_answer_tags_stripped():
    s = adapt("r1v", {"problem": "How many items are there?", "solution": "<answer> 3 </answer>",
                      "image": "img/7.png"})
    assert s.solution == "3" and s.images == ["/data/set/img/7.png"]
    assert content_types(s) == ["image", "text"]


def test_easyr1_images_inline_and_embedded_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "emb"))
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buf, format="PNG")
    record = {"problem": "Find x in <image> given <image>.", "answer": 12,
              "images": [{"bytes": buf.getvalue(), "path": None}, "geo/2.png"]}
    s = adapt("easyr1", record)
    assert s.solution == "12" and content_types(s) == ["text", "image", "text", "image", "text"]
    emb = Path(s.images[0])
    assert emb.parent == tmp_path / "emb" and emb.read_bytes() == buf.getvalue()
    assert adapt("easyr1", record).images[0] == s.images[0]  # content-addressed: written once
    assert s.images[1] == "/data/set/geo/2.png"


def test_convert_writes_embedded_media_next_to_its_output_and_only_there(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "default"))
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 8, 7)).save(buf, format="PNG")
    src = tmp_path / "in.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"problem": ["<image>How many?"], "answer": ["2"],
                             "images": [[{"bytes": buf.getvalue(), "path": "a.png"}]]}), src)
    convert("easyr1", src, tmp_path / "out" / "train.jsonl")
    written = json.loads((tmp_path / "out" / "train.jsonl").read_text())["images"][0]
    assert (tmp_path / "out" / written).parent == tmp_path / "out" / "train_media"
    assert (tmp_path / "out" / written).read_bytes() == buf.getvalue()
    # The folder was the conversion's only: an adapter called afterwards uses the default again.
    s = adapt("easyr1", {"problem": "<image>How many?", "answer": "2",
                         "images": [{"bytes": buf.getvalue(), "path": None}]})
    assert Path(s.images[0]).parent == tmp_path / "default"


def test_easyr1_video_record():
    s = adapt("easyr1", {"problem": "<video>What happens?", "answer": "a dog runs",
                         "videos": ["v/1.mp4"]})
    assert s.videos == ["/data/set/v/1.mp4"] and s.task == "video_qa" and s.solution == "a dog runs"


def test_video_r1_multiple_choice_video():
    s = adapt("video_r1", {
        "problem_id": 7, "problem": "What does the person do first?", "data_type": "video",
        "problem_type": "multiple choice", "options": ["A. sit", "B. run", "C. jump", "D. wave"],
        "process": "<think>...</think>", "solution": "<answer>B</answer>",
        "path": "./LLaVA-Video/clip.mp4", "data_source": "LLaVA-Video-178K"})
    assert s.id == "7" and s.videos == ["/data/set/LLaVA-Video/clip.mp4"] and not s.images
    assert s.solution == "B" and s.task == "multiple_choice"  # problem_type routes the rewards
    assert s.fields["options"] == ["A. sit", "B. run", "C. jump", "D. wave"]
    assert s.fields["problem_type"] == "multiple choice" and s.fields["data_source"] == "LLaVA-Video-178K"
    assert "Options:\nA. sit\nB. run" in text_of(s) and "<answer>" in text_of(s)
    assert content_types(s) == ["video", "text"]


def test_video_r1_numerical_image():
    s = adapt("video_r1", {"problem": "What is the area?", "data_type": "image",
                           "problem_type": "numerical", "solution": "<answer>3.5</answer>",
                           "path": "math/1.png"})
    assert s.images == ["/data/set/math/1.png"] and s.solution == "3.5" and s.task == "numerical"
    assert "options" not in s.fields


def test_r1_aqa_avqa_index_answer():
    s = adapt("r1_aqa", {
        "id": 183, "video_name": "-HG3Omg_89c_000030", "question_text": "What happened in the video?",
        "multi_choice": ["motorboat", "Yacht consignment", "Sailboat set sail", "Consignment car"],
        "answer": 1, "question_type": "Happening", "dataset_name": "AVQA",
        "audio_path": "wavs/-HG3Omg_89c_30.wav"})
    assert s.solution == "B" and s.audios == ["/data/set/wavs/-HG3Omg_89c_30.wav"]
    assert s.task == "audio_qa" and s.fields["options"][1] == "B. Yacht consignment"
    assert "What happened in the audio?" in text_of(s) and content_types(s) == ["audio", "text"]


def test_r1_aqa_mmau_text_answer():
    s = adapt("r1_aqa", {"question": "Which instrument plays?", "choices": ["piano", "violin"],
                         "answer": "violin", "audio": "/abs/x.wav"})
    assert s.solution == "B" and s.audios == ["/abs/x.wav"]


def test_time_r1_grounding():
    s = adapt("time_r1", {
        "video": "./videos/4jujhM5qhEc_00:00:39:000_00:01:24:700.mp4", "duration": 45.7,
        "timestamp": [34.9, 41.9], "sentence": "the statue of a man on horseback.",
        "qid": "my|internvid-vtime|4jujhM5qhEc", "video_start": 39.0, "video_end": 84.7})
    assert s.solution == [34.9, 41.9] and s.task == "temporal_grounding"
    assert s.id == "my|internvid-vtime|4jujhM5qhEc" and s.fields["duration"] == 45.7
    # The clip is already cut: these must not reach load_media's segment overrides.
    assert "video_start" not in s.fields and s.fields["source_video_start"] == 39.0
    assert '"the statue of a man on horseback"' in text_of(s)
    assert s.videos == ["/data/set/videos/4jujhM5qhEc_00:00:39:000_00:01:24:700.mp4"]


def test_time_r1_timestamps_variant():
    s = adapt("time_r1", {"video": "v.mp4", "duration": 30, "timestamps": [[1, 4.5]],
                          "sentences": ["person opens a door"]})
    assert s.solution == [1.0, 4.5]


@pytest.mark.parametrize("fmt,record,msg", [
    ("vlm_r1", {"image": "a.png", "conversations": [{"from": "human", "value": "<image>Q"}]}, "no gpt turn"),
    ("vlm_r1", {"image": "a.png", "conversations": "Q"}, "conversations"),
    ("vlm_r1", {"conversations": [{"from": "human", "value": "<image>Q"}, {"from": "gpt", "value": "1"}]},
     "mark 1 image"),
    ("r1v", {"problem": "Q", "image": "a.png"}, "answer"),
    ("r1v", {"solution": "1", "image": "a.png"}, "question"),
    ("easyr1", {"problem": "Q", "answer": "1", "images": [3]}, "images"),
    ("video_r1", {"problem": "Q", "problem_type": "multiple choice", "options": ["A. x", "B. y"],
                  "solution": "<answer>E</answer>", "path": "v.mp4", "data_type": "video"}, "not a letter"),
    ("video_r1", {"problem": "Q", "solution": "1", "data_type": "audio", "path": "x"}, "data_type"),
    ("video_r1", {"problem": "Q", "solution": "1", "data_type": "video"}, "path"),
    ("r1_aqa", {"question": "Q", "choices": ["a", "b"], "answer": 5, "audio": "x.wav"}, "outside"),
    ("r1_aqa", {"question": "Q", "choices": ["a", "b"], "answer": 0}, "audio"),
    ("time_r1", {"video": "v.mp4", "duration": 10, "timestamp": [5, 2], "sentence": "s"}, "segment"),
    ("time_r1", {"video": "v.mp4", "duration": 10, "timestamp": "soon", "sentence": "s"}, "timestamp"),
    ("time_r1", {"video": "v.mp4", "timestamp": [1, 2]}, "event description"),
    ("time_r1", ["not", "a", "dict"], "JSON object"),
])
def test_malformed_records_name_the_source(fmt, record, msg):
    with pytest.raises(RecordError, match=msg) as e:
        adapt(fmt, record)
    assert str(e.value).startswith(SRC + ":")


# ------------------------------------------------------------------------ convert / inspect ----

def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_convert_round_trips_through_the_native_schema(tmp_path):
    src = tmp_path / "anchor" / "train.jsonl"
    src.parent.mkdir()
    records = [
        {"problem_id": i, "problem": f"Q{i}?", "data_type": "video", "problem_type": "multiple choice",
         "options": ["A. x", "B. y"], "solution": "<answer>A</answer>", "path": f"v/{i}.mp4"}
        for i in range(3)]
    _write_jsonl(src, records)
    out = tmp_path / "native" / "train.jsonl"
    summary = convert("video_r1", src, out)
    assert summary == {"records": 3, "out": str(out), "by_task": {"multiple_choice": 3},
                       "format": "video_r1"}
    direct = load_samples(src, fmt="video_r1")
    native = load_samples(out)
    for a, b in zip(direct, native):
        assert (a.id, a.task, a.messages, a.solution, a.fields) == (b.id, b.task, b.messages, b.solution, b.fields)
        assert [Path(p).resolve() for p in a.videos] == [Path(p).resolve() for p in b.videos]
    assert json.loads(out.read_text().splitlines()[0])["videos"] == ["../anchor/v/0.mp4"]


def test_convert_time_r1_json_list_with_media_root(tmp_path):
    src = tmp_path / "dataset" / "annotations" / "train_2k5.json"
    src.parent.mkdir(parents=True)
    src.write_text(json.dumps([{"video": "./dataset/videos/a.mp4", "duration": 12.0,
                                "timestamp": [1.0, 4.0], "sentence": "a dog barks",
                                "video_start": None, "video_end": None}]))
    out = tmp_path / "native.jsonl"
    convert("time_r1", src, out, media_root=tmp_path)
    (s,) = load_samples(out)
    assert Path(s.videos[0]).resolve() == (tmp_path / "dataset" / "videos" / "a.mp4").resolve()
    assert s.solution == [1.0, 4.0] and s.fields == {"duration": 12.0}
    assert s.task == "temporal_grounding" and s.source == f"{out}:1"


def test_convert_stops_at_a_malformed_record_and_writes_nothing(tmp_path):
    src = tmp_path / "in.jsonl"
    _write_jsonl(src, [{"problem": "Q", "answer": "1"}, {"problem": "Q"}])
    with pytest.raises(RecordError, match=f"{src}:2"):
        convert("easyr1", src, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_inspect_lists_every_line_that_is_not_json_and_inspects_the_rest(tmp_path):
    """It stopped at the first such line ("cannot be read"), counting nothing after it;
    training still stops there, naming it."""
    path = tmp_path / "d.jsonl"
    good = json.dumps({"task": "counting", "prompt": "How many?", "solution": "1"}).encode()
    path.write_bytes(b"\n".join([good, b"not json", good, b'{"prompt": "cut', b"caf\xe9",
                                  good, b""]))
    rep = inspect_file(path)
    assert rep["records"] == 3 and rep["by_task"] == {"counting": 3}
    assert [line.split(": ")[0] for line in rep["bad_records"]] == [f"{path}:{i}"
                                                                    for i in (2, 4, 5)]
    assert "not UTF-8 text" in rep["bad_records"][2]
    assert "malformed records: 3" in format_report(rep)
    with pytest.raises(RecordError, match=f"{path}:2: not valid JSON"):
        load_samples(path)


def test_inspect_counts_and_lists_bad_media(tmp_path):
    write_mp4(tmp_path / "ok.mp4", np.zeros((4, 16, 16, 3), np.uint8), 4)
    (tmp_path / "broken.mp4").write_bytes(b"not a video at all")
    Image.new("RGB", (8, 8)).save(tmp_path / "ok.png")
    _write_jsonl(tmp_path / "d.jsonl", [
        {"task": "counting", "prompt": "How many?", "images": ["ok.png"], "solution": "1"},
        {"task": "counting", "prompt": "How many?", "images": ["gone.png"], "solution": "2"},
        {"task": "video_qa", "prompt": "Where?", "videos": ["ok.mp4"], "solution": "A"},
        {"task": "video_qa", "prompt": "Where?", "videos": ["broken.mp4"], "solution": "B"},
        {"task": "asr", "prompt": "Say it", "solution": None},
        {"task": "chat", "prompt": "Hello", "solution": "hi"},
    ])
    rep = inspect_file(tmp_path / "d.jsonl", n_show=2)
    assert rep["records"] == 6
    assert rep["by_task"] == {"counting": 2, "video_qa": 2, "chat": 1}
    assert rep["by_modality"] == {"image": 2, "video": 2, "text": 1}
    assert len(rep["bad_records"]) == 1 and f"{tmp_path / 'd.jsonl'}:5" in rep["bad_records"][0]
    bad = {(m["source"], Path(m["path"]).name) for m in rep["bad_media"]}
    assert bad == {(f"{tmp_path / 'd.jsonl'}:2", "gone.png"), (f"{tmp_path / 'd.jsonl'}:4", "broken.mp4")}
    assert all(m["source"] in m["error"] and m["path"] in m["error"] for m in rep["bad_media"])
    assert [e["prompt"] for e in rep["examples"]] == ["user: <image> How many?"] * 2
    text = format_report(rep)
    assert "media that fail to open: 2" in text and "gone.png" in text
    deep = inspect_file(tmp_path / "d.jsonl", deep=True)
    assert len(deep["bad_media"]) == 2


def test_inspect_reads_anchor_formats(tmp_path):
    _write_jsonl(tmp_path / "aqa.jsonl", [
        {"question": "Q?", "choices": ["a", "b"], "answer": "a", "audio": "missing.wav"}])
    rep = inspect_file(tmp_path / "aqa.jsonl", fmt="r1_aqa")
    assert rep["by_task"] == {"audio_qa": 1} and rep["by_modality"] == {"audio": 1}
    assert len(rep["bad_media"]) == 1
    assert rep["examples"][0]["prompt"].startswith("user: <audio> Q?\nA. a\nB. b")


def test_render_prompt_string_content():
    from mmrl.types import Sample

    s = Sample(id="x", messages=[{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Go"}]}])
    assert render_prompt(s) == "system: Be brief.\nuser: <video> Go"


@pytest.mark.parametrize("prompt,options,shown", [
    ("How many in 2 rows?", ["1", "2", "3"], False),  # a bare "2" in the question is no listing
    ("How many?\nA. 1\nB. 2", ["1", "2"], True),
    ("Colour? (A) red (B) blue", ["red", "blue"], True),
    ("Which animal is it: the brown horse or the cat?", ["brown horse", "black cat"], False),
])
def test_options_reach_the_prompt_unless_it_lists_them(prompt, options, shown):
    from mmrl.data.schema import with_options

    out = with_options(prompt, {"choices": options}, "x.jsonl:1")
    expected = prompt if shown else prompt + "\nOptions:\n" + "\n".join(
        f"{chr(65 + i)}. {o}" for i, o in enumerate(options))
    assert out == expected
