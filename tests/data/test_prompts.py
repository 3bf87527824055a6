"""Prompt templates (issue 11): named anchor templates and custom strings, applied at load time
so that rollout, SFT and eval see the same prompt; the resized frame from data.image_max_pixels."""
import json

import pytest
from PIL import Image

from mmrl import config
from mmrl.config import RewardSpec
from mmrl.data.prompts import TEMPLATES, apply_template
from mmrl.data.schema import FORMATS
from mmrl.train.scoring import RewardSet
from mmrl.data.prepare import build_datasets
from rewards import get_reward


def _text(sample):
    return sample.messages[-1]["content"][-1]["text"]


def _video_r1(ptype="multiple choice"):
    return FORMATS.get("video_r1")({
        "problem_id": 1, "problem": "What happens first?", "data_type": "video",
        "problem_type": ptype, "options": ["A. sit", "B. run"], "solution": "<answer>B</answer>",
        "path": "v.mp4"}, "f:1", __import__("pathlib").Path("/d"))


def test_named_think_template_replaces_the_adapter_hint_and_asks_for_think():
    s = apply_template(_video_r1(), "video_r1")
    text = _text(s)
    assert text.startswith("What happens first?\nOptions:\nA. sit\nB. run\nPlease think")
    assert "<think> </think>" in text and "single option letter" in text
    assert "Answer with the option letter" not in text  # the adapter's own hint is replaced
    assert "<think>" not in _text(apply_template(_video_r1(), "video_r1_nothink"))


def test_custom_template_with_fields_and_a_clear_error():
    s = apply_template(_video_r1(), "Q: {question} ({problem_type}) <think>")
    assert _text(s).endswith("(multiple choice) <think>")
    with pytest.raises(ValueError, match="uses {duration}"):
        apply_template(_video_r1(), "{question} {duration}")
    with pytest.raises(ValueError, match="neither a template name"):
        apply_template(_video_r1(), "nope")


def test_every_think_template_satisfies_format_think():
    for name, tpl in TEMPLATES.items():
        asks = "<think>" in tpl
        assert asks == (not name.endswith("_nothink") and name != "answer"), name


def test_train_and_eval_get_the_template_and_the_processor_budget(tmp_path):
    Image.new("RGB", (1600, 1200)).save(tmp_path / "a.png")
    rec = {"image": "a.png", "conversations": [
        {"from": "human", "value": "<image>Where is the dog?"},
        {"from": "gpt", "value": "[160, 120, 800, 600]"}]}
    (tmp_path / "d.jsonl").write_text(json.dumps(rec) + "\n")
    cfg = config.load(None, [f"data.train={tmp_path / 'd.jsonl'}",
                             f"data.eval={tmp_path / 'd.jsonl'}", "data.format=vlm_r1",
                             "data.prompt_template=vlm_r1", "data.image_max_pixels=1003520"])
    train, evals = build_datasets(cfg, 28)
    for s in (train[0], evals[0]):
        assert "<think> </think>" in _text(s)
        # 1600x1200 under 1003520 pixels: the processor's input is 1148x840, as transformers'
        # own smart_resize says.
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
        assert smart_resize(1200, 1600, 28, 56 * 56, 1003520) == (840, 1148)
        assert s.fields["resized_size"] == [1148, 840]
    exact = "<answer>[%s, %s, %s, %s]</answer>" % (160 * 1148 / 1600, 120 * 840 / 1200,
                                                    800 * 1148 / 1600, 600 * 840 / 1200)
    rs = RewardSet([RewardSpec(name="iou", params={"coords": "qwen2_5_vl"})])
    _, per = rs.score(train, [exact])
    assert per["iou"][0] == pytest.approx(1.0)


def test_the_image_the_processor_gets_is_the_box_rewards_resized_size(tmp_path):
    """One source of truth: under data.image_max_pixels, qwen-vl-utils resizes the image before
    the processor (as the anchors do); that frame is `resized_size`, and the processor keeps it."""
    from qwen_vl_utils import fetch_image
    from transformers import Qwen2VLImageProcessor

    from mmrl.data.prepare import media_loader

    Image.new("RGB", (1600, 1200), (200, 30, 30)).save(tmp_path / "a.png")
    (tmp_path / "d.jsonl").write_text(json.dumps({"image": "a.png", "conversations": [
        {"from": "human", "value": "<image>Where?"}, {"from": "gpt", "value": "[1, 2, 3, 4]"}]}))
    cfg = config.load(None, [f"data.train={tmp_path / 'd.jsonl'}", "data.format=vlm_r1",
                             "data.image_max_pixels=1003520"])
    (s,) = build_datasets(cfg, 28)[0]
    (image,) = media_loader(cfg, 28)(s)["images"]
    assert list(image.size) == s.fields["resized_size"] == [1148, 840]
    ref = fetch_image({"image": str(tmp_path / "a.png"), "min_pixels": 56 * 56,
                       "max_pixels": 1003520})
    assert image.size == ref.size and list(image.getdata()) == list(ref.getdata())
    processor = Qwen2VLImageProcessor(size={"shortest_edge": 56 * 56, "longest_edge": 1003520})
    thw = processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
    assert [thw[2] * 14, thw[1] * 14] == [1148, 840]  # the processor does not resize it again
