"""`mmrl bench --which async` reads its figures as documented: RL steps/s between the first and
last logged step (metrics.jsonl's wall clock), and the learning table's bar (docs/learning.md)."""
import json

from mmrl.bench.async_bench import _rl_rate, async_table, meets_bar


def test_the_bar_is_the_learning_tables():
    ok = {"accuracy_before_rl": 0.70, "accuracy_after_rl": 1.0,
          "accuracy_shuffled_images": 0.25, "chance": 0.30}
    assert meets_bar(ok)
    assert not meets_bar({**ok, "accuracy_after_rl": 0.84})  # gain 0.14 < 0.15
    # Shuffled images well above chance but no better than before RL: still reads the image.
    assert meets_bar({**ok, "accuracy_shuffled_images": 0.60})
    assert not meets_bar({**ok, "accuracy_before_rl": 0.5, "accuracy_shuffled_images": 0.6,
                          "accuracy_after_rl": 0.9})
    assert not meets_bar({**ok, "chance": None})


def test_rl_rate_times_from_the_first_to_the_last_logged_step(tmp_path):
    rows = [{"step": s, "time": 100.0 + 0.5 * s} for s in range(1, 11)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    rate, steps, wall = _rl_rate(tmp_path)
    assert (steps, wall, rate) == (9, 4.5, 2.0)


def test_the_table_gives_the_ratio():
    run = {"rl_wall_s": 10.0, "accuracy_before_rl": 0.7, "accuracy_after_rl": 1.0,
           "accuracy_shuffled_images": 0.25, "chance": 0.3, "meets_bar": True}
    r = {"recipe": "quickstart.yaml", "seed": 0, "quick": False, "speedup": 1.5,
         "runs": {"k0": {**run, "max_staleness": 0, "rl_steps_per_s": 1.0},
                  "k1": {**run, "max_staleness": 1, "rl_steps_per_s": 1.5}}}
    text = "\n".join(async_table(r))
    assert "| 1 | 1.50 | 10 | 0.70 | 1.00 | 0.25 | 0.30 | yes |" in text and "**x1.50**" in text


def test_one_run_prints_both_ratios_of_issue_54_with_their_bars():
    """`mmrl bench --which async,decode`: k1/k0 steps/s and compiled/eager decode side by side
    (logged at the end and at the top of bench.md), with the cores and load they were read on."""
    from mmrl.bench.report import headline, markdown

    run = {"meets_bar": True}
    results = {"machine": {"cpus": 2}, "load_average": [3.0, 2, 1], "load_average_end": [5.5],
               "async": {"speedup": 1.15, "runs": {"k0": run, "k1": {"meets_bar": False}}},
               "decode": {"speedup": 1.56, "speedup_vs_hf_generate": 2.24}}
    lines = headline(results)
    assert lines == [
        "k = 1 / k = 0 RL steps/s (quickstart): x1.15 (bar >= 1.3x: not met); the learning "
        "meets its bar: k0 yes, k1 no",
        "compiled / eager decode tokens/s (tiny Qwen2.5-VL, bar >= 2x): x1.56 over mmrl's "
        "eager static-cache loop (not met), x2.24 over HF generate's decode (met)",
        "Ratios of one run on 2 cores, load 3.0 at start and 5.5 at end: each side runs after "
        "the other, so a load that changes between them moves the ratio (docs/benchmarks.md)"]
    quick = headline({**results, "quick": True})[-1]
    assert quick.endswith("; --quick: tiny sizes, not numbers to report")
    assert headline({"machine": {}}) == []
    assert markdown({"machine": {}}).count("- ") == 0
