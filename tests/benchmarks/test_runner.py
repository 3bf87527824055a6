"""The benchmark runner as training calls it, on a tiny Qwen2.5-VL: fixture copies in each
benchmark's Hub layout, the result file (settings, budget, per-sample rows, the history of
stages), a missing copy's one line, the run summary's rows and the report's panel."""
import json

import pytest

from mmrl.models.codec import Codec
from mmrl.benchmarks import BENCHMARKS, MissingCopy
from mmrl.benchmarks.runner import root_of, run_benchmark, summary_rows
from mmrl.config import BenchmarkSpec, load
from mmrl.models import get_adapter


def test_runs_on_fixture_copies_and_writes_rows(tmp_path, family="qwen2_5_vl",
                                               names=("refcoco", "vstar")):
    cfg = load(None, [f"model.family={family}", "data.train=x", "data.image_max_pixels=3136"])
    adapter = get_adapter(family)
    model, processor = adapter.tiny()
    for name in names:
        spec = BenchmarkSpec(name=name, path="fixture", limit=2, max_new_tokens=8)
        res = run_benchmark(model, Codec(adapter, processor), cfg, spec, tmp_path, stage="before_rl",
                            step=0)
        run_benchmark(model, Codec(adapter, processor), cfg, spec, tmp_path, stage="after_rl", step=2)
        assert res["n"] == 2 and res["failed"] == 0
        assert res["score"] == res[BENCHMARKS[name].metric]
        doc = json.loads((tmp_path / "eval" / "benchmarks" / f"{name}.json").read_text())
        assert [h["stage"] for h in doc["history"]] == ["before_rl", "after_rl"]
        assert doc["budget"]["image_max_pixels"] == 3136 and doc["lmms_eval_task"]
        assert len(doc["rows"]) == 2 and all(r["completion"] is not None for r in doc["rows"])
        assert doc["rows"][0]["prompt"] and doc["rows"][0]["result"] is not None


def test_a_missing_copy_is_one_line_naming_the_download(tmp_path):
    with pytest.raises(MissingCopy) as e:
        BENCHMARKS["mmau"].rows(root_of(BenchmarkSpec(name="mmau", path=str(tmp_path)), tmp_path))
    line = str(e.value)
    assert "\n" not in line and "lmms-lab-audio/mmau" in line and str(tmp_path) in line


def test_summary_rows_and_report_panel(tmp_path):
    from mmrl.report.curves import curve_groups
    from mmrl.report.load import load_run

    summary = {"benchmarks_before_rl": {"bench/vstar": 25.0, "time/benchmarks": 1.0},
               "benchmarks_after_rl": {"bench/vstar": 50.0, "bench/vstar_no_tools": 20.0}}
    assert summary_rows(summary) == [("vstar (accuracy)", "25.000 -> 50.000"),
                                     ("vstar_no_tools (accuracy)", "- -> 20.000")]
    (tmp_path / "eval" / "benchmarks").mkdir(parents=True)
    (tmp_path / "eval" / "benchmarks" / "vstar.json").write_text(json.dumps(
        {"benchmark": "vstar", "metric": "accuracy", "history": [
            {"stage": "before_rl", "step": 0, "score": 25.0},
            {"stage": "after_rl", "step": 4, "score": 50.0}]}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 2, "bench/vstar": 30.0}) + "\n")
    groups = [g for g in curve_groups([load_run(tmp_path)]) if g.keys == ["bench/vstar"]]
    assert [(g.title, g.ylabel) for g in groups] == [("Benchmark: vstar", "accuracy")]



def test_periodic_runs_respect_every(tmp_path):
    """Training's hook runs only the benchmarks whose `every` divides the step (every: 0 = before
    and after RL only), on the Policy's model (here a stand-in with the Policy's interface)."""
    import contextlib
    import types

    from mmrl.benchmarks.runner import run_due
    from mmrl.train.dist import DistInfo

    cfg = load(None, ["data.train=x", "eval.benchmarks=[{name: vstar, every: 2, path: fixture, "
                                      "limit: 2, max_new_tokens: 4}, {name: mmau, every: 0}]"])
    assert run_due(None, cfg, tmp_path, "step_000001", 1) == {}  # none due: nothing touched
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny()
    policy = types.SimpleNamespace(model=model, codec=Codec(adapter, processor),
                                   info=DistInfo(), full_params=contextlib.nullcontext)
    got = run_due(policy, cfg, tmp_path, "step_000002", 2)
    assert set(got) == {"bench/vstar", "time/benchmarks"} and got["time/benchmarks"] > 0


def test_a_tool_benchmark_in_training_uses_the_runs_tools(tmp_path, monkeypatch):
    """With tools, the benchmark draws through the trainer's environment kind (its Toolbox,
    built once per run); the tool-less setting builds no Toolbox either."""
    import contextlib
    import types

    from mmrl.benchmarks.runner import run_due
    from mmrl.rollout.environments import make_environments
    from mmrl.tools import Toolbox
    from mmrl.train.dist import DistInfo

    cfg = load(None, ["data.train=x", "tools.use=[{name: crop}]", "tools.max_turns=2",
                      "eval.benchmarks=[{name: vstar, every: 1, path: fixture, limit: 2, "
                      "max_new_tokens: 4}, {name: vstar, every: 1, path: fixture, limit: 2, "
                      "max_new_tokens: 4, tools: false}]"])
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny()
    codec = Codec(adapter, processor)
    envs = make_environments(cfg, codec)
    built = []
    real = Toolbox.__init__
    monkeypatch.setattr(Toolbox, "__init__", lambda self, *a, **k: (built.append(1),
                                                                   real(self, *a, **k))[1])
    policy = types.SimpleNamespace(model=model, codec=codec, info=DistInfo(),
                                   full_params=contextlib.nullcontext)
    got = run_due(policy, cfg, tmp_path, "step_000001", 1, envs)
    assert {"bench/vstar", "bench/vstar_no_tools"} <= set(got) and built == []
    doc = json.loads((tmp_path / "eval" / "benchmarks" / "vstar.json").read_text())
    assert len(doc["rows"]) == 2


def test_a_row_outside_the_schema_is_one_line_naming_it(tmp_path):
    from mmrl.benchmarks.base import write_parquet

    write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet",
                  [{"question_id": "1", "text": "Which? (A) x (B) y"}])  # no image, no label
    cfg = load(None, ["data.train=x"])
    why = r"row 0 of .* layout \(KeyError: 'label'\); columns: question_id, text"
    with pytest.raises(SystemExit, match=why):
        run_benchmark(None, Codec(get_adapter("qwen2_5_vl"), None), cfg,
                      BenchmarkSpec(name="vstar", path=str(tmp_path)), tmp_path)
