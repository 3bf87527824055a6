"""Charades-STA: mmrl's prompt and scorer equal lmms-eval's `temporal_grounding_charades`
(doc_to_text with the yaml's pre/post prompts, process_results, the IOU@3/5/7 and mIOU
aggregations) on a fixture in the Hub schema and >= 200 predictions: ranges, clock times,
loose numbers, reversed, several intervals, none."""
import pytest

from mmrl.benchmarks import charades
from mmrl.benchmarks.base import Context
from tests.benchmarks.lmms import task_module

FORMS = ["The event happens in the {s} - {e} seconds.", "{s} to {e}", "{e} - {s}",
         "starts at 0:0{si} and ends at 0:0{ei}", "It happens from 00:00:0{si} - 00:00:0{ei}",
         "start {s}, end {e}", "", "no idea", "between 1 and 2 or 3 and 4", "7",
         "The event starts at {s}s and ends at {e}s", "{s}s-{e}s", "happens in 0:01-0:02",
         "A specific example is : 20.8 - 30.0 seconds. It happens in {s} - {e}",
         "start time: {s}\nend time: {e}", "1.5 – 2.5"]


def test_prompt_and_scores_equal_lmms_eval(tmp_path):
    lm = task_module("charades_sta.utils")
    charades.write_fixture(tmp_path, 20, 0)
    rows = charades.BENCHMARK.rows(tmp_path)
    kwargs = {"pre_prompt": charades.PRE, "post_prompt": charades.POST}
    for row in rows:
        assert charades.prompt(row) == lm.temporal_grounding_doc_to_text(row, kwargs)
    ctx, mine, theirs = Context(), [], []
    for i in range(224):
        row = rows[i % len(rows)]
        s, e = row["timestamp"]
        text = FORMS[i % len(FORMS)].format(s=s, e=e, si=int(s), ei=int(e) + 1)
        m = charades.score(row, text, ctx)
        assert m["pred"] == [list(p) for p in lm.extract_time(text)], text
        mine.append(m)
        theirs.append(lm.temporal_grounding_process_results_generation(row, [text])
                      ["charades_sta_mIOU"])
    got = charades.aggregate(mine)
    for ours, fn in (("R@0.3", lm.temporal_grounding_aggregate_iou3),
                     ("R@0.5", lm.temporal_grounding_aggregate_iou5),
                     ("R@0.7", lm.temporal_grounding_aggregate_iou7),
                     ("mIoU", lm.temporal_grounding_aggregate_miou)):
        assert got[ours] == pytest.approx(fn(theirs, None), abs=1e-9), ours
    assert 0 < got["mIoU"] < 100
