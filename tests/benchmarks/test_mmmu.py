"""MMMU val: mmrl's messages and scorer equal lmms-eval's `mmmu_val` (mmmu_doc_to_messages'
interleaving, mmmu_process_results with the MMMU repo's parsers, mmmu_aggregate_results) on a
fixture in the Hub schema (image_1..image_7 cells, options as a list's text, validation_SUBJECT_N
ids) and >= 200 predictions; the option parser's random letter is drawn from the same seeded
stream on both sides."""
import ast
import io
import random

import pytest
from PIL import Image

from mmrl.benchmarks import mmmu
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

MC = ["{a}", "({a})", "The answer is {a}.", "{w} ", "", "I think the answer is (B) not (C)",
      "{opt}", "the figure clearly shows that there are {opt} here", "{a}.", "Z", "(A)(B)",
      "b", "A B C"]
OPEN = ["{g}", "The answer is {g}.", "so it is {g}", "x = {g}", "1,000.5", "{g}0", "",
        "It could be 12. Therefore the final result is {g}", "nothing", "3e2", "A"]


def _with_images(row: dict) -> dict:
    return {k: Image.open(io.BytesIO(v["bytes"])) if k.startswith("image_") and v else v
            for k, v in row.items()}


def test_messages_and_scores_equal_lmms_eval(tmp_path):
    lm = task_module("mmmu.utils")
    mmmu.write_fixture(tmp_path, 24, 0)
    rows = mmmu.BENCHMARK.rows(tmp_path)
    kwargs = {"prompt_type": "format", "multiple_choice_prompt": mmmu.MC_PROMPT,
              "open_ended_prompt": mmmu.OPEN_PROMPT}
    for row in rows:
        theirs = lm.mmmu_doc_to_messages(_with_images(row), kwargs)[0]["content"]
        assert [{k: v for k, v in c.items() if k != "url"} for c in theirs] == mmmu.content(row)
        assert len(mmmu.image_keys(row)) == len(lm.mmmu_doc_to_visual(_with_images(row)))
    ctx, mine, theirs = Context(rng=random.Random(5)), [], []
    random.seed(5)  # lmms-eval draws its fallback letter from the global stream
    for i in range(260):
        row = rows[i % len(rows)]
        if row["question_type"] == "multiple-choice":
            opts = ast.literal_eval(row["options"])
            wrong = "ABC"[("ABC".index(row["answer"]) + 1) % 3]
            text = MC[i % len(MC)].format(a=row["answer"], w=wrong,
                                          opt=opts["ABC".index(row["answer"])])
        else:
            text = OPEN[i % len(OPEN)].format(g=row["answer"])
        m, t = mmmu.score(row, text, ctx), lm.mmmu_process_results(row, [text])["mmmu_acc"]
        got_pred = t["parsed_pred"][0]
        assert (set(m["parsed_pred"]) if isinstance(m["parsed_pred"], list) else m["parsed_pred"]) \
            == (set(got_pred) if isinstance(got_pred, list) else got_pred), text
        assert m["correct"] == float(lm.evaluate_mmmu([t])[1]["acc"]), text
        mine.append(m)
        theirs.append(t)
    got = mmmu.aggregate(mine)
    assert got["accuracy"] == pytest.approx(lm.mmmu_aggregate_results(theirs), abs=1e-12)
    assert 0 < got["accuracy"] < 1
