"""Fault injection, one test (or a few) per case of "runs that survive their users": reused run
dirs, resumed logs, bad media in every loader, disk full, non-UTF-8 data, NaN rewards and losses,
a mistyped model path, one-line errors and Ctrl-C, unsafe checkpoints, NaN in JSON."""
from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mmrl import config
from mmrl.data.inspect import inspect_file
from mmrl.data.media import MediaError
from mmrl.data.schema import RecordError, load_samples
from mmrl.data.prepare import build_datasets
from mmrl.train import checkpoint, rundir, setup
from mmrl.train.loop import Trainer
from mmrl.train.run import train
from mmrl.train.scoring import RewardError, RewardSet, Scorer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rel")
    path = tiny_config(root / "tiny.yaml", root / "data",
                       data={"eval": "{data}/eval.jsonl",
                             "generate_kwargs": {"n_train": 24, "n_eval": 4}},
                       rollout={"num_generations": 2, "max_new_tokens": 4},
                       log={"rollouts_every": 1})
    cfg = config.load(path, [f"log.run_dir={root / 'gen'}"])
    build_datasets(cfg, 28)  # writes the synthetic data once
    return path


def _cfg(tiny_yaml: Path, run_dir: Path, *overrides: str) -> config.RunConfig:
    return config.load(tiny_yaml, [f"log.run_dir={run_dir}", *overrides])


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _bad_copy(tiny_yaml: Path, tmp_path: Path, which: str, bad: dict[int, str]) -> Path:
    """A copy of the train/eval file whose record i uses image `bad[i]` ("missing" or "thin")."""
    src = tiny_yaml.parent / "data" / f"{which}.jsonl"
    rows = _rows(src)
    Image.new("RGB", (600, 2)).save(tmp_path / "thin.png")  # aspect ratio 300: processor refuses
    for i, kind in bad.items():
        rows[i]["images"] = [str(tmp_path / ("thin.png" if kind == "thin" else "gone.png"))]
    for r in rows:
        r["images"] = [str(src.parent / p) if not Path(p).is_absolute() else p
                       for p in r["images"]]
    out = tmp_path / f"{which}.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


# -- case 1: one run per run dir ------------------------------------------------------------------

def test_fresh_run_into_used_dir_stops_and_overwrite_replaces(tiny_yaml, tmp_path):
    train(_cfg(tiny_yaml, tmp_path, "train.steps=1"))
    first_id = config.load(tmp_path / "config.yaml").train.run_id
    assert first_id and checkpoint.load_state(checkpoint.latest(tmp_path))["run_id"] == first_id
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(rundir.RunDirError) as e:
        train(_cfg(tiny_yaml, tmp_path, "train.steps=1"))
    msg = str(e.value)
    assert "\n" not in msg and all(s in msg for s in (
        "train.resume=auto", "log.run_dir=", "train.overwrite=true"))
    assert len(_rows(tmp_path / "metrics.jsonl")) == 1  # untouched
    train(_cfg(tiny_yaml, tmp_path, "train.steps=1", "train.overwrite=true"))
    second_id = config.load(tmp_path / "config.yaml").train.run_id
    assert second_id != first_id and [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [1]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only the run's own files go


def test_resume_auto_refuses_another_runs_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step_000030"
    ckpt.mkdir(parents=True)
    torch.save({"step": 30, "run_id": "oldrun"}, ckpt / checkpoint.STATE_FILE)
    save_file({"w": torch.zeros(1)}, ckpt / "model.safetensors")  # verifies: it holds weights
    (tmp_path / "config.yaml").write_text("train:\n  run_id: newrun\n")
    cfg = config.load(None, ["data.train=x.jsonl", f"log.run_dir={tmp_path}",
                             "train.resume=auto"])
    with pytest.raises(rundir.RunDirError, match="belongs to run oldrun, not to this run"):
        rundir.prepare(cfg)


# -- case 2: resumed logs hold each step once ------------------------------------------------------

def test_resume_cuts_logs_back_to_the_checkpoint(tiny_yaml, tmp_path):
    common = ["train.steps=2", "train.save_every=1", "train.keep_checkpoints=0"]
    train(_cfg(tiny_yaml, tmp_path, *common))
    # As if killed after logging step 2 but before its checkpoint, mid-way through a line.
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step_000002")
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss/lo')
    train(_cfg(tiny_yaml, tmp_path, *common, "train.resume=auto"))
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [1, 2]
    steps = [r["step"] for r in _rows(tmp_path / "rollouts.jsonl")]
    assert steps.count(1) == steps.count(2) == 2 * 2  # B * G rows each, once


def test_tensorboard_purges_steps_past_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mmrl.train.logging import RunLogger

    log = RunLogger(tmp_path, progress="off")
    for step in (1, 2, 3):
        log.log(step, {"x": float(step)})
    log.close()
    rundir.truncate_jsonl(tmp_path / "metrics.jsonl", 1)
    log = RunLogger(tmp_path, progress="off")
    for step in (2, 3):
        log.log(step, {"x": 10.0 * step})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 1.0), (2, 20.0), (3, 30.0)]


# -- case 3: the skip policy everywhere media is loaded ------------------------------------------

def test_processor_rejection_names_record_and_sft_eval_skip(tiny_yaml, tmp_path):
    train_file = _bad_copy(tiny_yaml, tmp_path, "train", {i: "missing" for i in range(6, 24, 2)}
                           | {7: "thin"})
    eval_file = _bad_copy(tiny_yaml, tmp_path, "eval", {i: "thin" for i in range(4)})
    base = [f"data.train={train_file}", f"data.eval={eval_file}", "data.generate=null"]
    t = Trainer(_cfg(tiny_yaml, tmp_path / "strict", *base))
    with pytest.raises(MediaError, match=r"train.jsonl:8: the processor rejected .*aspect ratio"):
        t.prompts.features(t.prompts.dataset[7])
    t.close()
    summary = train(_cfg(tiny_yaml, tmp_path / "skip", *base, "data.on_bad_sample=skip",
                         "train.steps=1", "sft.steps=2", "sft.batch_size=8", "sft.eval_every=2"))
    assert summary["sft"]["steps"] == 2
    text = (tmp_path / "skip" / "summary.json").read_text()
    on_disk = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in summary.json"))
    assert on_disk["eval_after_rl"]["failed"] == 4 and on_disk["accuracy_after_rl"] is None
    assert _rows(tmp_path / "skip" / "metrics.jsonl")[0]["data/skipped"] > 0
    # ... and `data inspect --deep` finds the same record; the header check alone does not.
    from mmrl.data.inspect import processor_check
    from mmrl.models import get_adapter

    deep = processor_check(get_adapter("qwen2_5_vl"))
    assert any("aspect ratio" in m["error"] and m["source"].endswith(":8")
               for m in inspect_file(train_file, deep=True, deep_check=deep)["bad_media"])
    assert not any(m["kind"] == "processor" for m in inspect_file(train_file)["bad_media"])


# -- case 4: disk full during a checkpoint write ---------------------------------------------------

def test_failed_checkpoint_write_cleans_up_and_keeps_previous(tiny_yaml, tmp_path, monkeypatch):
    from mmrl.models import get_adapter

    model, processor = get_adapter("qwen2_5_vl").tiny(min_pixels=3136, max_pixels=3136)
    checkpoint.save(tmp_path, 1, model, processor, {"step": 1})

    def full(*a, **kw):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0\n"
                           "basic_ios::clear: iostream error")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(tmp_path, 2, model, processor, {"step": 2})
    msg = str(e.value)
    assert "step_000002" in msg and "GiB free in" in msg and "step_000001 is intact" in msg
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path).name == "step_000001"
    assert checkpoint.load_state(checkpoint.latest(tmp_path))["step"] == 1
    # A leftover of a killed write is cleaned at the next start.
    (tmp_path / "checkpoints" / ".tmp-step_000002").mkdir()
    cfg = config.load(None, ["data.train=x.jsonl", f"log.run_dir={tmp_path}", "train.resume=auto"])
    assert rundir.prepare(cfg).name == "step_000001"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


# -- case 5: non-UTF-8 bytes -----------------------------------------------------------------------

def test_non_utf8_data_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a", "solution": "1"}\n{"prompt": "caf\xe9", "solution": "1"}\n')
    with pytest.raises(RecordError, match=r"d.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\)"):
        load_samples(path)
    report = inspect_file(path)
    assert "d.jsonl:2: not UTF-8" in report["bad_records"][0]


# -- case 7: non-finite rewards and losses ---------------------------------------------------------

def test_nan_and_string_rewards_are_errors(tiny_yaml):
    samples = load_samples(tiny_yaml.parent / "data" / "eval.jsonl")[:2]
    for name, what in (("nan_reward", "returned nan"), ("string_reward", "returned '1.0' (str)")):
        rs = RewardSet([config.RewardSpec(name=f"mmrl_test_rewards:{name}")])
        with pytest.raises(RewardError) as e:
            rs.score(samples, ["a", "b"])
        assert f"reward '{name}' {what}" in str(e.value) and samples[0].id in str(e.value)


def test_nonfinite_loss_or_grad_skips_the_step_then_stops(tiny_yaml, tmp_path, monkeypatch):
    t = Trainer(_cfg(tiny_yaml, tmp_path / "a"))
    before = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    batch, scores, per, _ = t.sample_batch()
    t.scorer.advantages = lambda s, *a: torch.full_like(s, float("nan"))  # a NaN loss
    m = t.learn(batch, scores, per)
    assert math.isnan(m["loss/loss"]) and m["train/nonfinite_skipped"] == 1
    assert all(torch.equal(v, before[k]) for k, v in t.policy.model.named_parameters())
    del t.scorer.advantages
    p = next(p for p in t.policy.model.parameters() if p.requires_grad)
    hook = p.register_hook(lambda g: g * float("inf"))  # finite loss, inf gradient norm
    m = t.learn(batch, scores, per)
    hook.remove()
    assert math.isinf(m["grad_norm"]) and t.learner.nonfinite_streak == 2
    assert all(torch.equal(v, before[k]) for k, v in t.policy.model.named_parameters())
    t.close()
    monkeypatch.setattr(Scorer, "advantages", lambda self, s, *a: torch.full_like(s, math.nan))
    with pytest.raises(FloatingPointError, match="NaN/inf in 2 steps in a row"):
        train(_cfg(tiny_yaml, tmp_path / "b", "train.steps=5", "train.max_nonfinite_steps=2"))
    assert [r["train/nonfinite_skipped"] for r in _rows(tmp_path / "b" / "metrics.jsonl")] == [1, 2]


# -- case 8: mistyped local model path -------------------------------------------------------------

def test_mistyped_local_model_path(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = config.load(None, ["data.train=x.jsonl", "model.path=./models/Qwen2.5-VL-3B-Instruc"])
    with pytest.raises(FileNotFoundError, match="no such local directory"):
        setup.check_environment(cfg)


# -- case 9: one-line errors, short config summary, Ctrl-C -----------------------------------------

def test_errors_are_one_line_without_debug(tiny_yaml, tmp_path, capsys):
    from mmrl.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "\xff", "solution": "1"}\n')
    args = ["train", str(tiny_yaml), f"log.run_dir={tmp_path / 'run'}", f"data.train={bad}",
            "data.generate=null"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "bad.jsonl:1: not UTF-8" in err
    # the config summary (run, algo, decode path, run dir, memory check) and the error, no dump
    lines = err.strip().splitlines()
    assert len(lines) <= 7 and sum("not UTF-8" in ln for ln in lines) == 1, lines
    with pytest.raises(RecordError):
        main(["--debug", *args])


def test_ctrl_c_finishes_step_saves_and_prints_resume(tiny_yaml, user_rewards, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmrl.cli", "train", str(tiny_yaml), f"log.run_dir={run_dir}",
           "train.steps=200", "data.eval=null"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(user_rewards)]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").stat().st_size):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "train.resume=auto" in err
    last = _rows(run_dir / "metrics.jsonl")[-1]["step"]
    assert 1 <= last < 200 and checkpoint.latest(run_dir).name == f"step_{last:06d}"


# -- case 10: checkpoints load without running code ------------------------------------------------

class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['MMRL_REL_MARKER']}",))


def test_crafted_trainer_state_is_refused(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("MMRL_REL_MARKER", str(marker))
    ckpt = tmp_path / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    with (ckpt / checkpoint.STATE_FILE).open("wb") as f:
        pickle.dump({"step": 1, "rng": _Exploit()}, f)
    with pytest.raises(checkpoint.CheckpointError, match="refusing to load"):
        checkpoint.load_state(ckpt)
    assert not marker.exists()


# -- case 11: rewards CLI ---------------------------------------------------------------------------

def test_rewards_cli_one_line_errors(tmp_path):
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"completion": "<answer>1</answer>", "solution": "1"}\n')
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"completion": "caf\xe9", "solution": "1"}\n')
    for args, says in (
            (["--input", str(tmp_path / "nope.jsonl")], "nope.jsonl: No such file"),
            (["--input", str(latin)], "latin.jsonl: line 1: not UTF-8"),
            (["--input", str(ok), "--param", "tol=abc"], "--param tol=abc: tol must be a number")):
        r = subprocess.run([sys.executable, "-m", "rewards", "score", "--reward", "accuracy", *args],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
        assert says in r.stderr
