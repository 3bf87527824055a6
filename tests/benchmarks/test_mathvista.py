"""MathVista testmini: mmrl's prompt and rule-based scorer equal lmms-eval's
`mathvista_testmini_format` (mathvista_doc_to_text, mathvista_process_results with
quick_extract, mathvista_aggregate_results) on a fixture in the Hub schema and >= 200
predictions. lmms-eval sends what its rules cannot read to a GPT judge: here its judge call is
replaced by one that answers "" (no judge: the rule-based path mmrl reports), and its client is
built with a placeholder key that nothing ever sends."""
import math

import pytest

from mmrl.benchmarks import mathvista
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

FORMS = ["{a}", " {a} ", 'The answer is "{a}".', "{w}", "", "(A)", "B", "(b) maybe", "C.",
         "A", "{a}.0", "1e3", "nan", "inf", "I think it is {a}", "[{a}]", 'The answer is "".',
         "-{a}", "{a} cm", "3.14159"]


def test_prompt_and_rule_scores_equal_lmms_eval(tmp_path, monkeypatch):
    pytest.importorskip("Levenshtein", reason="lmms-eval's MathVista normaliser imports it")
    monkeypatch.setenv("OPENAI_API_KEY", "unused-offline-placeholder")
    lm = task_module("mathvista.utils")
    monkeypatch.setattr(lm.mathvista_evaluator, "get_chat_response", lambda *a, **k: "")
    monkeypatch.setitem(lm.config["metadata"], "quick_extract", True)
    mathvista.write_fixture(tmp_path, 24, 0)
    rows = mathvista.BENCHMARK.rows(tmp_path)
    kwargs = {"shot_type": "format-prompt", "shot": 0, "use_caption": False, "use_ocr": False}
    for row in rows:
        assert mathvista.prompt(row) == lm.mathvista_doc_to_text(row, kwargs)
    mine, theirs = [], []
    for i in range(240):
        row = rows[i % len(rows)]
        text = FORMS[i % len(FORMS)].format(a=row["answer"], w=(row.get("choices") or ["x"])[-1])
        m, t = mathvista.score(row, text, Context()), lm.mathvista_process_results(
            row, [text])["llm_as_judge_eval"]
        assert (m["extraction"], m["prediction"], m["true_false"]) == \
            (t["extraction"], t["prediction"], t["true_false"]), text
        mine.append(m)
        theirs.append(t)
    got = mathvista.aggregate(mine)
    assert math.isclose(got["accuracy"], lm.mathvista_aggregate_results(theirs, None))
    assert 0 < got["accuracy"] < 100
