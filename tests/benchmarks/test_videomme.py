"""Video-MME (with and without subtitles): mmrl's prompts and scorer equal lmms-eval's
`videomme` / `videomme_w_subtitle` (doc_to_text, doc_to_text_subtitle at 32 frames over real
mp4 + .srt files, videomme_process_results with its robust letter extractor,
videomme_aggregate_results) on a fixture in lmms-eval's cache layout and >= 200 predictions."""
import pytest

from mmrl.benchmarks import videomme
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

FORMS = ["{a}", "({a})", "{a}.", "The answer is {a}", "{w}", "", "I think {w}. No: the best "
         "answer is {a}", "{a}: because", "Option {a}) is right", "none", "a", "The correct "
         "choice is ({a}).", "{w} or {a}", "BAD", "E", "答案是{a}", "{a}\n", "x {w} y",
         "Between A and B, B", "{a}{w}"]


def test_prompts_and_scores_equal_lmms_eval(tmp_path, monkeypatch):
    lm = task_module("videomme.utils")
    root = tmp_path / "videomme"  # lmms-eval's cache dir: HF_HOME/videomme
    monkeypatch.setattr(lm, "base_cache_dir", str(tmp_path))
    videomme.write_fixture(root, 12, 0)
    rows = videomme.BENCHMARK.rows(root)
    default = {"pre_prompt": "", "post_prompt": videomme.POST}
    for row in rows:
        assert videomme.prompt(row) == lm.videomme_doc_to_text(row, default)
        theirs = lm.videomme_doc_to_text_subtitle(row, {"frame_num": 32, "pre_prompt": ""})
        assert videomme.prompt_with_subtitles(row, root) == theirs
    assert "hello 0\nbye 0" in videomme.prompt_with_subtitles(rows[0], root)
    assert "No subtitles available" in videomme.prompt_with_subtitles(rows[1], root)
    ctx, mine, theirs = Context(), [], []
    for i in range(240):
        row = rows[i % len(rows)]
        wrong = "ABCD"[("ABCD".index(row["answer"]) + 1) % 4]
        text = FORMS[i % len(FORMS)].format(a=row["answer"], w=wrong)
        m = videomme.score(row, text, ctx)
        t = lm.videomme_process_results(row, [text])["videomme_perception_score"]
        assert (m["pred_answer"], m["score"]) == (t["pred_answer"], t["score"]), text
        mine.append(m)
        theirs.append(t)
    got = videomme.aggregate(mine)
    assert got["accuracy"] == pytest.approx(lm.videomme_aggregate_results(theirs), abs=1e-12)
    assert 0 < got["accuracy"] < 100
