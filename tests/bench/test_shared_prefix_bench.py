"""mmrl.bench: a quick run writes JSON + markdown with equal losses in both layouts; the report
renders tables and the scaling plot from a results dict."""
from __future__ import annotations

import json

import pytest

from mmrl.bench import run_benchmarks
from mmrl.bench.report import markdown, plot_scaling


def test_quick_update_benchmark_writes_results(tmp_path):
    results = run_benchmarks(tmp_path, which=("update",), quick=True, log=lambda *_: None)
    saved = json.loads((tmp_path / "bench.json").read_text())
    update = saved["update"]
    assert update["loss_naive"] == pytest.approx(update["loss_shared"], abs=1e-5)
    assert update["loss_naive"] == pytest.approx(update["loss_varlen"], abs=1e-5)
    a = update["attention_scores"]
    assert a["varlen"] < a["shared"] and "varlen kernel" in (tmp_path / "bench.md").read_text()
    assert update["tokens_shared"] < update["tokens_naive"]
    assert len(update["naive"]["times_s"]) == len(update["shared"]["times_s"]) == 1
    assert "Speed-up" in (tmp_path / "bench.md").read_text()
    assert results["machine"]["threads"] >= 1
    with pytest.raises(ValueError, match="unknown benchmark"):
        run_benchmarks(tmp_path, which=("nope",))


def test_quick_varlen_benchmark_has_the_three_layouts_with_equal_losses(tmp_path):
    results = run_benchmarks(tmp_path, which=("varlen",), quick=True, log=lambda *_: None)
    rows = results["varlen"]["rows"]
    assert [(r["group"], r["uneven"]) for r in rows] == [(2, False), (2, True), (3, False)]
    for r in rows:
        assert r["loss_naive"] == pytest.approx(r["loss_shared"], abs=1e-5)
        assert r["loss_naive"] == pytest.approx(r["loss_varlen"], abs=1e-5)
        assert r["attention_scores"]["varlen"] < r["attention_scores"]["shared"]
    text = (tmp_path / "bench.md").read_text()
    assert "varlen / naive" in text and "peak RSS growth naive / shared / varlen" in text


def test_quick_runs_benchmark_packs_a_long_group_in_runs_with_equal_losses(tmp_path):
    """The tool-row cell (a short prompt, long completions) packs in runs smaller than the
    group; the 8-token cell packs whole; every layout's loss is the naive one."""
    results = run_benchmarks(tmp_path, which=("runs",), quick=True, log=lambda *_: None)
    rows = results["runs"]["rows"]
    assert [r["group"] for r in rows] == [2, 2]
    assert rows[0]["pack_size"] == 1 and rows[1]["pack_size"] == 2
    for r in rows:
        for layout in ("whole", "runs", "varlen"):
            assert r["losses"][layout] == pytest.approx(r["losses"]["naive"], abs=1e-5)
    assert "| P | G | C | runs of |" in (tmp_path / "bench.md").read_text()


def _cell(sweep, p, g, naive, shared):
    timing = lambda s: {"median_s": s, "min_s": s, "times_s": [s], "median_cpu_s": s, "cpu_times_s": [s]}
    return {"sweep": sweep, "prompt_tokens": p, "group": g, "completion_tokens": 64,
            "naive": timing(naive), "shared": timing(shared), "speedup": naive / shared,
            "speedup_min": naive / shared, "tokens_naive": g * (p + 64), "tokens_shared": p + g * 63,
            "memory_mb": {"naive": 10.0 * g, "shared": 2.0}}


def test_report_renders_scaling_table_and_plot(tmp_path):
    scaling = {"family": "qwen2_5_vl", "completion_tokens": 64, "trials": 3, "micro_batch": 8,
               "rows": [_cell("P", 256, 8, 4.0, 1.0), _cell("P", 1024, 8, 16.0, 2.0),
                        _cell("G", 1024, 4, 8.0, 2.0), _cell("G", 1024, 16, 32.0, 3.0)]}
    path = plot_scaling(scaling, tmp_path / "scaling.png")
    assert path.stat().st_size > 10_000
    text = markdown({"machine": {"cpu": "test cpu", "cpus": 2}, "scaling": scaling,
                     "plot": "scaling.png", "command": "mmrl bench"})
    assert "| P | 1024 | 8 | 16.00 (16.00) | 2.00 (2.00) | 8.00x |" in text
    assert "80 / 2" in text and "test cpu" in text and "![scaling](scaling.png)" in text


def test_quick_decode_benchmark_compares_eager_and_compiled_in_one_run(tmp_path, monkeypatch):
    from mmrl.models import compiled_decode

    monkeypatch.setattr(compiled_decode, "BACKEND", "eager")  # the plumbing, not inductor's speed
    results = run_benchmarks(tmp_path, which=("decode",), quick=True, log=lambda *_: None)
    d = results["decode"]
    assert d["greedy_identical"] and d["compiles"] == 1 and d["recompiles"] == 0
    assert d["decode_forwards"] == d["completion_tokens"] - 1
    assert d["speedup"] == d["compiled"]["tokens_per_s"] / d["eager"]["tokens_per_s"]
    assert 0 < d["eager"]["bandwidth_share"] and d["peak_bytes_per_s"] > 0
    assert "Compiled / eager decode tokens/s" in (tmp_path / "bench.md").read_text()
