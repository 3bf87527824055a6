"""MMAU test-mini: mmrl's prompt and scorer equal lmms-eval's `mmau_test_mini` (doc_to_text with
its post-prompt, process_results, mmau_aggregate_results) on a fixture in the Hub schema (choices
as a JSON string, audio as {bytes, path}) and >= 200 predictions, malformed ones included: their
random letter comes from the same seeded stream on both sides."""
import json
import random

import pytest

from mmrl.benchmarks import mmau
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module


def predictions(rows: list[dict], n: int) -> list[tuple[dict, str]]:
    forms = [
        lambda r, c: "ABCD"[c.index(r["answer"])],  # right
        lambda r, c: f"({'ABCD'[(c.index(r['answer']) + 1) % len(c)]})",  # wrong, in parentheses
        lambda r, c: f"The answer is {'ABCD'[c.index(r['answer'])]}.",
        lambda r, c: "A or B? I pick B",  # several: the last one wins
        lambda r, c: "",  # nothing: a random letter
        lambda r, c: "a",  # lower case: no letter, random
        lambda r, c: r["answer"],  # the choice's text, no letter
        lambda r, c: "C.",
        lambda r, c: "D",  # past a 2- or 3-choice row: lmms-eval raises, mmrl counts it wrong
        lambda r, c: "!B!",
        lambda r, c: "(A) (C)",
    ]
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        out.append((row, forms[i % len(forms)](row, json.loads(row["choices"]))))
    return out


def test_prompt_and_scores_equal_lmms_eval(tmp_path):
    lm = task_module("mmau.utils")
    mmau.write_fixture(tmp_path, 30, 0)
    rows = mmau.BENCHMARK.rows(tmp_path)
    kwargs = {"pre_prompt": "", "post_prompt": mmau.POST}  # the task yaml's defaults
    for row in rows:
        assert mmau.prompt(row) == lm.doc_to_text(row, kwargs)
    pairs = predictions(rows, 242)
    ctx, results, mine = Context(rng=random.Random(3)), [], []
    random.seed(3)  # lmms-eval draws from the global stream
    for row, text in pairs:
        m = mmau.score(row, text, ctx)
        try:
            theirs = lm.mmau_process_results(dict(row), [text])["accuracy"]
        except IndexError:  # a letter past the row's choices
            assert m["overall"] == 0.0
            continue
        assert m["overall"] == theirs["overall"], text
        results.append(theirs)
        mine.append(m)
    assert len(results) >= 200
    got = mmau.aggregate(mine)
    assert got["accuracy"] == pytest.approx(lm.mmau_aggregate_results(results), abs=0)
    assert 0 < got["accuracy"] < 100
    assert set(got) == {"accuracy", "accuracy/music", "accuracy/sound", "accuracy/speech"}
