"""Anchor records that carried no signal before issue 11: box image sizes, reward routes, MMAU,
Charades dicts, Time-R1 clips, one-line convert errors. Records follow each anchor's published
layout (VLM-R1 LLaVA conversations, Visual-RFT problem/solution, Video-R1, MMAU test-mini,
Time-R1 / VideoChat-R1 Charades annotations)."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl import cli
from mmrl.data.formats import convert
from mmrl.data.media import load_media
from mmrl.data.schema import load_samples
from mmrl.data.synthetic_av import write_mp4
from rewards import get_reward


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_vlm_r1_box_records_get_image_size_and_iou_scores(tmp_path):
    Image.new("RGB", (1600, 1200)).save(tmp_path / "COCO_1.jpg")
    src = _jsonl(tmp_path / "rec.jsonl", [{
        "id": 1, "image": "COCO_1.jpg",
        "conversations": [{"from": "human", "value": "<image>Please provide the bounding box "
                           "coordinate of the region this sentence describes: left dog."},
                          {"from": "gpt", "value": "[100.0, 200.0, 500.0, 600.0]"}]}])
    convert("vlm_r1", src, tmp_path / "out.jsonl")
    for sample in (load_samples(tmp_path / "out.jsonl")[0], load_samples(src, "vlm_r1")[0]):
        assert sample.task == "detection" and sample.fields["image_size"] == [1600, 1200]
        # qwen2_5_vl coordinates with Qwen's default budget: 1600x1200 stays 1596x1204.
        pred = "<answer>[99.75, 200.67, 498.75, 602.0]</answer>"
        (score,) = get_reward("iou")([pred], [sample.solution], coords="qwen2_5_vl",
                                     **{k: [v] for k, v in sample.fields.items()})
        assert score == pytest.approx(1.0, abs=1e-4)


def test_vlm_r1_accu_reward_method_is_the_task_route():
    from mmrl.data.schema import FORMATS
    s = FORMATS.get("vlm_r1")({"image": "a.png", "accu_reward_method": "mcq", "conversations": [
        {"from": "human", "value": "<image>Which? A. x B. y"}, {"from": "gpt", "value": "B"}]},
        "f:1", Path("/d"))
    assert s.task == "multiple_choice" and s.fields["accu_reward_method"] == "mcq"


def test_visual_rft_position_boxes_are_detection_with_image_size(tmp_path):
    Image.new("RGB", (640, 480)).save(tmp_path / "img.jpg")
    sol = '<answer>[{"Position": [254, 303, 291, 365], "Confidence": 1}]</answer>'
    src = _jsonl(tmp_path / "rft.jsonl", [{"problem": "Detect all objects belonging to the "
                                           "category 'dog' in the image.", "solution": sol,
                                           "image": "img.jpg"}])
    (s,) = load_samples(src, "r1v")
    assert s.task == "detection" and s.fields["image_size"] == [640, 480]
    out = '<answer>[{"Position": [254, 303, 291, 365], "Confidence": 0.9}]</answer>'
    assert get_reward("detection")([out], [s.solution]) == [1.0]


def test_video_r1_problem_types_route(tmp_path):
    rows = [{"problem_id": i, "problem": "Q?", "data_type": "video", "problem_type": t,
             "options": [], "process": "", "solution": f"<answer>{a}</answer>",
             "path": "./Video-R1-data/v.mp4", "data_source": "x"}
            for i, (t, a) in enumerate([("numerical", "3"), ("OCR", "STOP"),
                                        ("free-form", "a dog"), ("regression", "2.5")])]
    tasks = [s.task for s in load_samples(_jsonl(tmp_path / "v.jsonl", rows), "video_r1")]
    assert tasks == ["numerical", "ocr", "free_form", "regression"]


def test_mmau_test_mini_converts_and_keeps_its_task_as_a_field(tmp_path):
    src = tmp_path / "mmau-test-mini.json"
    src.write_text(json.dumps([{
        "id": "e6d8c6f4", "audio_id": "./test-mini-audios/e6d8c6f4.wav",
        "question": "What is the gender of the speaker?", "choices": ["Man", "Woman", "Child"],
        "answer": "Woman", "dataset": "IEMOCAP", "task": "speech", "split": "test-mini",
        "category": "Speaker Identification", "sub-category": None, "difficulty": "easy"}]))
    assert convert("r1_aqa", src, tmp_path / "o.jsonl")["by_task"] == {"audio_qa": 1}
    (s,) = load_samples(tmp_path / "o.jsonl")
    assert s.solution == "B" and s.fields["source_task"] == "speech"
    assert s.audios[0].endswith("test-mini-audios/e6d8c6f4.wav")


def test_charades_dict_per_video(tmp_path):
    src = tmp_path / "charades_train.json"
    src.write_text(json.dumps({"3MSZA": {"duration": 30.96, "timestamps": [[24.3, 30.4], [0, 6.1]],
                                         "sentences": ["person turn a light on.",
                                                       "a person is holding a book."]}}))
    samples = load_samples(src, "time_r1")
    assert [s.solution for s in samples] == [[24.3, 30.4], [0.0, 6.1]]
    assert samples[0].videos == [str(tmp_path / "3MSZA.mp4")]
    assert samples[1].fields["duration"] == 30.96 and '"a person is holding a book"' in \
        samples[1].messages[0]["content"][-1]["text"]


def test_time_r1_source_video_clip_is_cut_and_shifted(tmp_path):
    frames = np.zeros((40, 32, 32, 3), np.uint8)
    write_mp4(tmp_path / "src.mp4", frames, fps=4)  # 10 s
    src = _jsonl(tmp_path / "t.jsonl", [{"video": "src.mp4", "duration": 10.0,
                                         "timestamp": [5.0, 7.0], "sentence": "a door opens",
                                         "video_start": 4.0, "video_end": 8.0}])
    (s,) = load_samples(src, "time_r1")
    assert s.solution == [1.0, 3.0] and s.fields["duration"] == 4.0
    video = load_media(s, video_kwargs={"fps": 2.0})["videos"][0]
    # qwen-vl-utils: the window is frames ceil(4 * 4) .. floor(8 * 4), both ends included
    assert len(video) == 8 and min(video.timestamps) == 4.0 and max(video.timestamps) == 8.0
    assert get_reward("tiou_v2")(["<answer>1 to 3</answer>"], [s.solution],
                                 duration=[s.fields["duration"]]) == [1.0]


@pytest.mark.parametrize("args, msg", [
    (["--from", "nope", "IN", "OUT"], "unknown data format 'nope'"),
    (["--from", "r1_aqa", "BAD", "OUT"], "is not a letter of"),
    (["--from", "r1_aqa", "MISSING", "OUT"], "does not exist"),
])
def test_convert_errors_are_one_line(tmp_path, capsys, args, msg):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "Q?", "choices": ["x", "y"],
                                           "answer": "Z", "audio_path": "a.wav"}])
    args = [str(bad) if a == "BAD" else str(tmp_path / "no.jsonl") if a == "MISSING"
            else str(tmp_path / "o.jsonl") if a == "OUT" else str(bad) if a == "IN" else a
            for a in args]
    assert cli.main(["data", "convert", *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
