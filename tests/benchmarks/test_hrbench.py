"""HR-Bench 4K: mmrl's prompt and rule-based scorer equal lmms-eval's `hrbench4k`
(hrbench_doc_to_text, hrbench_process_results, hrbench_aggregate_results) on a fixture in the
Hub schema (base64 images, A-D columns with a missing D, cycle categories) and >= 200
predictions. lmms-eval asks a GPT judge where its rules find no option: its request is replaced
by a judge that answers "Z" (no match), which is what mmrl scores without a judge."""
import pytest

from mmrl.benchmarks import hrbench
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

FORMS = ["{a}", "({a})", "{a}.", "The answer is {a}", "{w}", "", "{text}", "It is {text}.",
         "red or blue", "Z", "Cannot determine the answer", "{a} {w}", "a", "**{a}**",
         "[{a}]", "I pick {w}, final", "pale red", "none of these"]


def test_prompt_and_rule_scores_equal_lmms_eval(tmp_path, monkeypatch):
    lm = task_module("hrbench.utils")
    no_judge = {"choices": [{"message": {"content": "Z"}}]}
    monkeypatch.setattr(lm.hrbench_evaluator, "_post_request", lambda payload: no_judge)
    hrbench.write_fixture(tmp_path, 24, 0)
    rows = hrbench.BENCHMARK.rows(tmp_path)
    import pandas as pd

    docs = pd.DataFrame(rows).to_dict("records")  # as `datasets` hands lmms-eval a row (NaN)
    for row, doc in zip(rows, docs):
        assert hrbench.prompt(row) == lm.hrbench_doc_to_text(doc)
    ctx, mine, theirs = Context(), [], []
    for i in range(216):
        row, doc = rows[i % len(rows)], docs[i % len(rows)]
        wrong = "ABC"[("ABCD".index(row["answer"]) + 1) % 3]
        text = FORMS[i % len(FORMS)].format(a=row["answer"], w=wrong,
                                            text=hrbench.options(row).get(row["answer"], "x"))
        m, t = hrbench.score(row, text, ctx), lm.hrbench_process_results(doc, [text])["average"]
        assert m["score"] == t["gpt_score"], text
        mine.append(m)
        theirs.append(t)
    got = hrbench.aggregate(mine)
    assert got["accuracy"] == pytest.approx(lm.hrbench_aggregate_results(theirs, None), abs=1e-12)
    for cat in ("single", "cross"):
        sub = [t for t, r in zip(theirs, mine) if r["category"] == cat]
        assert got[f"accuracy/{cat}"] == pytest.approx(lm.hrbench_aggregate_results(sub, None))
    assert 0 < got["accuracy"] < 1
