"""`mmrl train` runs the memory plan for the device, process count and strategy before it loads
the model (mmrl/plan/fit.py). Driven on CPU through the real plan (meta-device builds of the
recipes' 7B shapes) with the device-memory query answering a fake size."""
from __future__ import annotations

from pathlib import Path

import pytest

from mmrl import cli
from mmrl import plan
from mmrl.plan import fit
from mmrl.train import loop, run

ROOT = Path(__file__).resolve().parents[2]
GIB = plan.GIB


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """`mmrl train` from the repository root on one process; returns what `train` was given
    (it never runs: a loaded model would fail the test)."""
    monkeypatch.chdir(ROOT)
    for key in ("WORLD_SIZE", "RANK", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(key, raising=False)
    calls = []
    monkeypatch.setattr(run, "train", lambda cfg, predicted=None: calls.append(predicted))

    def no_model(*a, **k):
        raise AssertionError("the model was built")
    monkeypatch.setattr(loop.Trainer, "__init__", no_model)
    return lambda *args: cli.main(["train", *args, f"log.run_dir={tmp_path / 'run'}"]), calls


def _gpu(monkeypatch, gib):
    monkeypatch.setattr(fit, "device_memory_gib", lambda: gib)


def test_a_run_over_the_device_stops_before_the_model_loads_with_the_fix(launched, monkeypatch):
    main, calls = launched
    _gpu(monkeypatch, 80.0)
    with pytest.raises(SystemExit) as stopped:
        main("recipes/video_qa/config.yaml")
    text = str(stopped.value.code)
    assert calls == []  # train() was never reached: no weights loaded, no run dir made
    # video_qa's full fine-tuning on 1 x 80 GB: the README's table says 122.9 GiB in rollout
    assert "does not fit: predicted peak 122.9 GiB per GPU in the rollout phase" in text
    assert "over the usable 71.1 GiB (1 x 80.0 GiB, ddp" in text
    assert "add recipes/video_qa/1gpu.yaml" in text and "(48.6 GiB; fits" in text
    assert "The model was not loaded." in text
    assert "8 GPUs with zero2 (60.1 GiB a GPU): bash scripts/train.sh 8 " \
           "recipes/video_qa/config.yaml log.run_dir=" in text
    assert "train.parallel=deepspeed train.deepspeed_config=scripts/deepspeed/zero2.json" in text
    # the knob with the largest saving: LoRA drops the reference, AdamW state and gradients,
    # the shared prefill most of the prefill; each computed by the same plan
    assert "the knob that saves the most: model.lora.r=64 -> 77.1 GiB in rollout" in text
    assert "train.memory_check=warn" in text


def test_the_knob_named_is_the_one_whose_plan_is_lowest(monkeypatch):
    monkeypatch.chdir(ROOT)
    from mmrl import config

    cfg = config.load("recipes/video_qa/config.yaml", [], world=1)
    p = fit._variant("recipes/video_qa/config.yaml", [], 1, 80.0)
    knob, q = fit._best_knob(cfg, "recipes/video_qa/config.yaml", [], 1, 80.0, p)
    peaks = {tuple(k): fit._variant("recipes/video_qa/config.yaml", k, 1, 80.0).peak
             for k in fit.knobs(cfg)}
    assert q.peak == min(peaks.values()) < p.peak and peaks[tuple(knob)] == q.peak


def test_a_fitting_run_goes_on_with_the_prediction_for_its_summary(launched, monkeypatch,
                                                                  capsys):
    main, calls = launched
    _gpu(monkeypatch, 80.0)
    assert main("recipes/video_qa/config.yaml", "recipes/video_qa/1gpu.yaml") == 0
    (predicted,) = calls
    assert set(predicted) == {"rollout", "logprob", "update"}
    assert round(predicted["rollout"] / GIB, 1) == 48.6  # the README's 1gpu.yaml row
    assert "memory check: predicted peak 48.6 GiB in rollout of usable 71.1 GiB per GPU" in \
        capsys.readouterr().err


def test_warn_runs_anyway_and_says_so(launched, monkeypatch, capsys):
    main, calls = launched
    _gpu(monkeypatch, 80.0)
    assert main("recipes/video_qa/config.yaml", "train.memory_check=warn") == 0
    assert len(calls) == 1 and calls[0]["rollout"] / GIB > 71.1
    err = capsys.readouterr().err
    assert "memory check: WARNING, predicted not to fit: 122.9 GiB in rollout" in err


def test_off_and_cpu_make_no_plan_and_say_so(launched, monkeypatch, capsys):
    main, calls = launched
    _gpu(monkeypatch, 80.0)
    assert main("recipes/video_qa/config.yaml", "train.memory_check=off") == 0
    assert "memory check: off (train.memory_check=off)" in capsys.readouterr().err
    _gpu(monkeypatch, None)  # what a machine without CUDA answers
    assert main("recipes/video_qa/config.yaml") == 0
    assert "memory check: none on CPU" in capsys.readouterr().err
    assert calls == [None, None]


def test_a_config_the_plan_cannot_read_is_run_with_a_line_saying_why(launched, monkeypatch,
                                                                       capsys):
    main, calls = launched
    _gpu(monkeypatch, 80.0)
    assert main("recipes/vqa/config.yaml") == 0  # no image budget: the plan will not guess
    assert "memory check: skipped (no media budget in the config" in capsys.readouterr().err
    assert calls == [None]


def test_a_plan_that_breaks_is_a_stated_skip_not_a_stopped_run(monkeypatch):
    from mmrl import config

    monkeypatch.chdir(ROOT)
    _gpu(monkeypatch, 80.0)
    cfg = config.load("recipes/video_qa/config.yaml", [], world=1)

    def broken(cfg):
        raise KeyError("text")
    monkeypatch.setattr(plan, "config_facts", broken)
    check = fit.memory_check(cfg, "recipes/video_qa/config.yaml", [], world=1)
    assert check.line == "memory check: skipped (the plan failed: KeyError: 'text')"
    assert not check.refuses and check.predicted is None
