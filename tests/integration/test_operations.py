"""Runs that survive operations, as clusters and users treat them: SIGTERM (SLURM preemption,
docker stop, kill) saves and resumes, a second `mmrl train` on a held run dir stops, a resume
checks its edited config, a damaged newest checkpoint falls back to the intact one, the skip
policy keeps a run with missing images alive and stops one with none, and a failing custom
reward names the step and the sample. Signals and locks go to real `mmrl train` processes."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mmrl import config
from mmrl.cli import main
from mmrl.data.synthetic import GENERATORS
from mmrl.train import checkpoint
from mmrl.train.loop import Trainer
from mmrl.train.prompts import TooManyBadRecords
from mmrl.train.run import RunInterrupted, train

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

REWARDS = '''
import os, time
def variety(completions, solution, **fields):
    flag = os.environ.get("MMRL_OPS_FLAG")
    if flag:  # tells the test "scoring now", a line a call
        with open(flag, "a") as f:
            f.write("scored\\n")
    time.sleep(float(os.environ.get("MMRL_OPS_SLOW") or 0))
    return [len(set(c)) / 10 for c in completions]
def by_difficulty(completions, solution, difficulty, **fields):
    # full marks for the answer, else partial credit by difficulty: the start check (gold
    # answers) never reads "level", a random policy's completions do
    return [1.0 if c.endswith(f"<answer>{s}</answer>") else 0.5 / d["level"]
            for c, s, d in zip(completions, solution, difficulty)]
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_config) -> Path:
    """The tests' tiny trainer (conftest) at G=2 on 24 records, scored by REWARDS' variety."""
    root = tmp_path_factory.mktemp("ops")
    (root / "mmrl_ops_rewards.py").write_text(REWARDS)
    GENERATORS.get("counting")(root / "data", n_train=24, n_eval=4)
    sys.path.insert(0, str(root))
    yield tiny_config(root / "tiny.yaml", root / "data",
                      data={"eval": "{data}/eval.jsonl",
                            "generate_kwargs": {"n_train": 24, "n_eval": 4}},
                      rollout={"num_generations": 2, "max_new_tokens": 4},
                      rewards=[{"name": "mmrl_ops_rewards:variety"}], log={"rollouts_every": 1})
    sys.path.remove(str(root))


def _env(tiny: Path, **extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tiny.parent)]), **extra)


def _cli(tiny: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "mmrl.cli", "train", str(tiny), *args]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not (path.is_file() and path.stat().st_size):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _resume_args(err: str) -> list[str]:
    """The printed resume command, as a user pastes it (python -m mmrl.cli for `mmrl`)."""
    line = err[err.index("Resume with: ") + len("Resume with: "):].splitlines()[0]
    words = shlex.split(line)
    assert words[:2] == ["mmrl", "train"], line
    return [sys.executable, "-m", "mmrl.cli", *words[1:]]


# -- SIGTERM, the run-dir lock, a resume with an edited config -------------------------------

def test_sigterm_saves_a_locked_run_that_resumes_with_its_config_checked(tiny, tmp_path):
    run_dir = tmp_path / "my run"  # a space: the printed resume command must be quoted
    args = _cli(tiny, f"log.run_dir={run_dir}", "train.steps=200")
    first = subprocess.Popen(args, cwd=ROOT, env=_env(tiny), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    _wait_for(run_dir / "metrics.jsonl", first)
    second = subprocess.run(args, cwd=ROOT, env=_env(tiny), capture_output=True, text=True)
    assert second.returncode == 1
    assert f"{run_dir} is in use by process {first.pid} on {socket.gethostname()} (since " \
           in second.stderr and "Traceback" not in second.stderr
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=180)
    assert first.returncode == 143, err[-3000:]
    assert "SIGTERM: finishing this step" in err and "Traceback" not in err
    done = _rows(run_dir / "metrics.jsonl")[-1]["step"]
    assert checkpoint.latest(run_dir).name == f"step_{done:06d}" and f"(step {done})" in err
    resume = _resume_args(err)

    refused = subprocess.run(resume + ["rollout.num_generations=4", "train.seed=3"], cwd=ROOT,
                             env=_env(tiny), capture_output=True, text=True)
    assert refused.returncode == 1
    assert "these keys cannot change mid-run:\n  rollout.num_generations: 2 -> 4\n  " \
           "train.seed: 0 -> 3\n" in refused.stderr and "train.allow_config_change=true" \
           in refused.stderr

    steps = done + 2
    ok = subprocess.run(resume + [f"train.steps={steps}", "train.lr=5.0e-3"], cwd=ROOT,
                        env=_env(tiny), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"with a changed config, applied: train.lr: 0.001 -> 0.005; train.steps: 200 -> " \
           f"{steps}" in ok.stderr
    rows = _rows(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step logged once
    assert {r["lr"] for r in rows[:done]} == {1e-3} and {r["lr"] for r in rows[done:]} == {5e-3}
    text = (run_dir / "config.yaml").read_text()
    saved = config.load(run_dir / "config.yaml")  # the effective config, the originals noted
    assert (saved.train.lr, saved.train.steps) == (5e-3, steps)
    assert f"holds the after values):\n#   train.lr: 0.001 -> 0.005\n#   train.steps: 200 -> " \
           f"{steps}" in text


def test_sigterm_abandons_a_slow_rollout_and_the_resumed_run_equals_an_uninterrupted_one(
        tiny, tmp_path):
    common = ["train.steps=3", "train.stop_timeout=0.5", "data.eval=null"]
    slow = {"MMRL_OPS_SLOW": "2"}  # scoring (in the rollout stage) takes 2 s a step
    ref = subprocess.run(_cli(tiny, f"log.run_dir={tmp_path / 'ref'}", *common), cwd=ROOT,
                         env=_env(tiny, **slow), capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run_dir = tmp_path / "cut"
    proc = subprocess.Popen(_cli(tiny, f"log.run_dir={run_dir}", *common), cwd=ROOT,
                            env=_env(tiny, **slow), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(run_dir / "metrics.jsonl", proc)  # step 1 done: step 2 is in its rollout
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped in step 2, abandoned after train.stop_timeout=0.5 s (it is redone on " \
           "resume); checkpoint saved" in err and "(step 1)" in err
    done = subprocess.run(_resume_args(err), cwd=ROOT, env=_env(tiny), capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = _rows(tmp_path / "ref" / "metrics.jsonl"), _rows(run_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert (x["loss/loss"], x["reward/total_mean"]) == (y["loss/loss"], y["reward/total_mean"])


def test_sigterm_in_the_warm_up_or_the_evaluation_before_rl(tiny, tmp_path, monkeypatch):
    """In this process, with real signals: during setup and the warm-up nothing can be saved,
    and the message says so; during the evaluation before RL the warm-up's weights are saved
    (step 0), and the resumed run does not warm up again."""
    args = [f"log.run_dir={tmp_path}", "sft.steps=2", "sft.batch_size=4", "sft.eval_every=2",
            "eval.before_rl=true", "train.steps=1"]
    _signal_when(lambda: signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)  # in setup
    with pytest.raises(RunInterrupted) as e:
        train(config.load(tiny, args))
    assert e.value.exit_code == 143 and "stopped in the SFT warm-up after its step 0 of 2; " \
        "nothing saved (the warm-up keeps no checkpoint: it starts over on resume)" in str(e.value)
    assert checkpoint.latest(tmp_path) is None
    flag = tmp_path / "scoring"
    monkeypatch.setenv("MMRL_OPS_FLAG", str(flag))
    monkeypatch.setenv("MMRL_OPS_SLOW", "3")

    # The first call is the start check of what each reward can score; the second, the
    # evaluation before RL (the warm-up scores nothing).
    _signal_when(lambda: flag.exists() and len(flag.read_text().splitlines()) >= 2)
    with pytest.raises(RunInterrupted) as e:
        train(config.load(tiny, [*args, "train.resume=auto"]))
    assert "stopped in the evaluation before RL; checkpoint saved" in str(e.value) \
        and "(step 0)" in str(e.value)
    saved = checkpoint.load_state(checkpoint.latest(tmp_path))
    assert saved["step"] == 0 and saved["extra"]["summary"]["sft"]["steps"] == 2
    monkeypatch.delenv("MMRL_OPS_FLAG")
    monkeypatch.setenv("MMRL_OPS_SLOW", "0")
    summary = train(config.load(tiny, [*args, "train.resume=auto"]))
    assert summary["sft"]["steps"] == 2 and summary["steps"] == 1
    assert "accuracy_before_rl" in summary


def test_sigterm_in_a_periodic_evaluation_logs_that_step_whole_on_resume(tiny, tmp_path,
                                                                         monkeypatch):
    """A stop inside step 1's evaluation saves step 1 with its metrics held back; the resumed
    run evaluates step 1, logs it once with its eval/* values, then goes on."""
    args = [f"log.run_dir={tmp_path}", "eval.before_rl=false", "train.eval_every=1",
            "train.steps=2"]
    flag = tmp_path / "scoring"
    monkeypatch.setenv("MMRL_OPS_FLAG", str(flag))
    monkeypatch.setenv("MMRL_OPS_SLOW", "2")
    # Scoring calls: the start check, step 1's rollouts, then step 1's evaluation.
    _signal_when(lambda: flag.exists() and len(flag.read_text().splitlines()) >= 3)
    with pytest.raises(RunInterrupted) as e:
        train(config.load(tiny, args))
    assert "stopped after step 1, in its evaluation (it runs on resume" in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists() or not _rows(tmp_path / "metrics.jsonl")
    saved = checkpoint.load_state(checkpoint.latest(tmp_path))
    assert saved["step"] == 1 and "loss/loss" in saved["extra"]["unlogged_step"]
    monkeypatch.delenv("MMRL_OPS_FLAG")
    monkeypatch.setenv("MMRL_OPS_SLOW", "0")
    train(config.load(tiny, [*args, "train.resume=auto"]))
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("eval/accuracy" in r for r in rows)
    assert rows[0]["loss/loss"] == saved["extra"]["unlogged_step"]["loss/loss"]


def _signal_when(ready) -> None:
    """SIGTERM to this process, from another thread, once `ready()` (never before the run's
    handlers are installed: the default action would end pytest)."""
    def wait_then_signal():
        while not (ready() and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_then_signal, daemon=True).start()


# -- a damaged newest checkpoint -------------------------------------------------------------

def test_resume_skips_a_damaged_newest_checkpoint(tiny, tmp_path):
    train(config.load(tiny, [f"log.run_dir={tmp_path}", "train.save_every=1",
                             "train.keep_checkpoints=0", "data.eval=null"]))
    weights = tmp_path / "checkpoints" / "step_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a node crash mid-write, before fsync
    out = subprocess.run(_cli(tiny, f"log.run_dir={tmp_path}", "train.resume=auto",
                              "train.steps=3", "data.eval=null"),
                         cwd=ROOT, env=_env(tiny), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"skipping checkpoint {weights.parent}: model.safetensors is 1000 bytes" in out.stderr
    assert f"resumed from {tmp_path / 'checkpoints' / 'step_000001'} at step 1" in out.stderr
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [1, 2, 3]


# -- the skip policy -------------------------------------------------------------------------

def _missing_images(tiny: Path, tmp_path: Path, bad: range | list[int]) -> Path:
    rows = _rows(tiny.parent / "data" / "train.jsonl")
    for i, r in enumerate(rows):
        r["images"] = [str(tmp_path / "gone.png") if i in bad else
                       str(tiny.parent / "data" / p) for p in r["images"]]
    out = tmp_path / "train.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_skip_policy_keeps_a_run_with_a_quarter_missing_and_stops_one_with_none(
        tiny, tmp_path, capsys):
    """24 records, 6 without their image, 8 prompts a step: the old cumulative counter passed
    the data set's size after 4 epochs and stopped the run ("every training sample failed to
    load", naming nothing); the per-epoch share (25%) stays under data.max_bad_fraction."""
    data = _missing_images(tiny, tmp_path, range(0, 24, 4))
    summary = train(config.load(tiny, [
        f"log.run_dir={tmp_path / 'quarter'}", f"data.train={data}", "data.eval=null",
        "data.on_bad_sample=skip", "rollout.prompts_per_step=8", "train.steps=24"]))
    assert summary["steps"] == 24
    skipped = summary["skipped_records"]
    assert skipped["count"] >= 6 * 8  # every epoch meets them again (8 epochs)
    named = sorted((line.split(": ")[0] for line in skipped["first"]),  # in the order drawn
                   key=lambda where: int(where.rsplit(":", 1)[1]))
    assert named == [f"{data}:{i + 1}" for i in range(0, 24, 4)]
    err = capsys.readouterr().err
    assert err.count("skipped ") >= 6 and err.count(f"{data}:5: image") == 1  # printed once
    on_disk = json.loads((tmp_path / "quarter" / "summary.json").read_text())
    assert on_disk["skipped_records"] == skipped
    nothing = _missing_images(tiny, tmp_path, range(24))  # a wrong media root
    t = Trainer(config.load(tiny, [f"log.run_dir={tmp_path / 'none'}", f"data.train={nothing}",
                                   "data.eval=null", "data.on_bad_sample=skip"]))
    with pytest.raises(TooManyBadRecords) as e:
        t.train_step()
    t.close()
    assert str(e.value).startswith(
        f"24 of the 24 training records drawn in epoch 1 failed to load (100%, over "
        f"data.max_bad_fraction=0.5); the first:\n  {nothing}:")
    assert "gone.png: file not found" in str(e.value)


# -- a custom reward that fails --------------------------------------------------------------

def test_a_failing_reward_names_the_step_and_the_sample(tiny, tmp_path, capsys):
    rows = _rows(tiny.parent / "data" / "train.jsonl")
    for i, r in enumerate(rows):
        r["images"] = [str(tiny.parent / "data" / p) for p in r["images"]]
        r["difficulty"] = {} if i == 5 else {"level": 2}
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["train", str(tiny), f"log.run_dir={tmp_path / 'run'}", f"data.train={data}",
                 "data.eval=null", "data.shuffle=false", "train.steps=4",
                 "rewards=[{name: 'mmrl_ops_rewards:by_difficulty'}]"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"mmrl: error: step 3: reward 'by_difficulty' raised KeyError: 'level' on sample " \
           f"{rows[5]['id']} ({data}:6); fix the reward or the record" in err
