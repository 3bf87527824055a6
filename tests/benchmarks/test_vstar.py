"""V* Bench: mmrl's prompt and scorer equal lmms-eval's `vstar_bench` (vstar_doc_to_text with the
yaml's post-prompt, vstar_process_results, vstar_aggregate_results) on a fixture in the Hub
schema and >= 200 predictions of every shape its letter extractor meets."""
import pytest

from mmrl.benchmarks import vstar
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

FORMS = ["{a}", "({a})", "{a}.", "Answer: {a}", "The answer is {a}", "option {a}", "{a})",
         "I choose {a} because", "", "none of them", "b", "(E)", "A and B", "The color is {a}]",
         "{a}\n", "  {a}  ", "CD", "the correct choice is {w}", "Blue", "{w}. no wait {a}"]


def test_prompt_and_scores_equal_lmms_eval(tmp_path):
    lm = task_module("vstar_bench.utils")
    vstar.write_fixture(tmp_path, 24, 0)
    rows = vstar.BENCHMARK.rows(tmp_path)
    kwargs = {"pre_prompt": "", "post_prompt": vstar.POST}
    for row in rows:
        assert vstar.prompt(row) == lm.vstar_doc_to_text(row, kwargs)
    ctx, mine, theirs = Context(), [], []
    for i in range(240):
        row = rows[i % len(rows)]
        wrong = "ABCD"[("ABCD".index(row["label"]) + 1) % 4]
        text = FORMS[i % len(FORMS)].format(a=row["label"], w=wrong)
        m = vstar.score(row, text, ctx)
        t = lm.vstar_process_results(row, [text])["vstar_overall_acc"]
        assert (m["prediction"], m["score"]) == (t["prediction"], t["score"]), text
        mine.append(m)
        theirs.append(t)
    got = vstar.aggregate(mine)
    assert got["accuracy"] == pytest.approx(lm.vstar_aggregate_results(theirs), abs=1e-12)
    assert 0 < got["accuracy"] < 100
