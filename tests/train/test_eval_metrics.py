"""Evaluation metrics against hand-computed values and the reference libraries; the
shuffled-media control."""
import jiwer
import pytest
import sacrebleu

from mmrl.models.codec import Codec
from mmrl.train.evaluate import shuffle_media
from mmrl.train.metrics import pass_at_k, summarize, task_metrics
from mmrl.types import Sample


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong draws


def _rows(task, completions, solutions, fields=None):
    return [{"completion": c, "solution": s, "fields": fields or {}} for c, s in
            zip(completions, solutions)]


def test_detection_acc_and_miou():
    rows = _rows("detection", ["<answer>[0, 0, 10, 10]</answer>", "<answer>[0, 0, 5, 10]</answer>",
                               "no box"], [[0, 0, 10, 10]] * 3)
    m = task_metrics("detection", rows)
    assert m["acc@0.5"] == pytest.approx(2 / 3)  # IoUs 1.0, 0.5, 0
    assert m["miou"] == pytest.approx(0.5)


def test_temporal_grounding_recall_at_m():
    rows = _rows("temporal_grounding", ["<answer>0 to 10</answer>", "<answer>5 to 15</answer>"],
                 [[0, 10], [0, 10]])
    m = task_metrics("temporal_grounding", rows)
    assert m["miou"] == pytest.approx((1 + 5 / 15) / 2)
    assert m["r1@0.3"] == pytest.approx(1.0) and m["r1@0.5"] == pytest.approx(0.5)


def test_asr_and_bleu_match_reference_libraries():
    refs = ["one two three four", "five six"]
    hyps = ["one two tree four", "five six seven"]
    m = task_metrics("asr", _rows("asr", [f"<answer>{h}</answer>" for h in hyps], refs))
    assert m["wer"] == pytest.approx(jiwer.wer(refs, hyps))
    assert m["cer"] == pytest.approx(jiwer.cer(refs, hyps))
    caps = ["a red square and a blue circle", "two green triangles"]
    golds = ["a red square and a blue circle", "three green triangles"]
    b = task_metrics("captioning", _rows("captioning", caps, golds))
    assert b["bleu"] == pytest.approx(sacrebleu.corpus_bleu(caps, [golds]).score / 100)


def test_summarize_pass_at_k_over_draws():
    rows = []
    for sid, outcomes in (("a", [1, 0, 0, 0]), ("b", [0, 0, 0, 0])):
        for d, ok in enumerate(outcomes):
            rows.append({"id": sid, "draw": d, "task": "counting", "completion": "",
                         "solution": "1", "fields": {}, "rewards": {"accuracy": float(ok)}})
    m = summarize(rows, "accuracy", 4)
    assert m["pass@1"] == pytest.approx((0.25 + 0) / 2)
    assert m["pass@4"] == pytest.approx((1 + 0) / 2)


def test_shuffle_media_moves_images_videos_and_audio_from_one_donor():
    samples = [Sample(id=str(i), messages=[], images=[f"i{i}"], videos=[f"v{i}"],
                      audios=[f"a{i}"], fields={"duration": i}) for i in range(5)]
    out = shuffle_media(samples, seed=0)
    for s, o in zip(samples, out):
        donor = o.images[0][1:]
        assert donor != s.id  # a derangement
        assert o.videos == [f"v{donor}"] and o.audios == [f"a{donor}"]
        assert o.fields == s.fields and o.id == s.id
    assert sorted(o.images[0] for o in out) == sorted(s.images[0] for s in samples)


def test_an_evaluation_that_scores_nothing_says_why_instead_of_nan(tmp_path):
    """Every eval record's image missing, under data.on_bad_sample=skip: the accuracy line
    printed a bare `nan`."""
    from mmrl import config
    from mmrl.models import get_adapter
    from mmrl.train.evaluate import evaluate
    from mmrl.train.run import _accuracy_text

    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(min_pixels=3136, max_pixels=3136)
    cfg = config.load(None, ["data.train=x.jsonl", "data.on_bad_sample=skip"])
    samples = [Sample(id=f"e{i}", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many?"}]}], solution="2",
        images=[str(tmp_path / "gone.png")], source=f"eval.jsonl:{i + 1}") for i in range(3)]
    result = evaluate(model, Codec(adapter, processor), samples, cfg)
    assert result["n"] == 0 and result["failed"] == 3
    assert _accuracy_text(result) == (
        "n/a (reward 'accuracy' scored none of the 3 eval records: every one failed to load "
        "(data.on_bad_sample=skip; `mmrl data inspect FILE` lists why))")
