"""Asynchronous rollouts (rollout.max_staleness, mmrl/train/async_rollout.py; docs/async.md):
k = 0 is the synchronous loop bit for bit; k >= 1 trains no batch older than k versions, puts a
stale one back (its prompts drawn again), detects a skipped or incomplete weight sync, resumes
with batches in flight training each prompt once, and runs with tools."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from mmrl import config
from mmrl.train import async_rollout, async_worker, checkpoint
from mmrl.train.loop import Trainer
from mmrl.train.run import train

pytestmark = pytest.mark.integration
VARIETY = "rewards=[{name: 'mmrl_test_rewards:char_variety'}]"
QUIET = ("eval.before_rl=false", "data.eval=null", "log.progress=off")


@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny_async")
    return tiny_config(root / "tiny.yaml", root / "data",
                       data={"generate_kwargs": {"n_train": 48, "n_eval": 8}},
                       log={"rollouts_every": 1, "rollouts_per_step": 1000})


def _cfg(tiny_yaml: Path, run_dir: Path, *overrides: str) -> config.RunConfig:
    return config.load(tiny_yaml, [f"log.run_dir={run_dir}", *QUIET, VARIETY, *overrides])


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def _trained_ids(run_dir: Path) -> dict[int, list[str]]:
    """step -> the sample ids of its rows, from rollouts.jsonl."""
    out: dict[int, list[str]] = {}
    for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], []).append(r["sample_id"])
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(checkpoint.latest(run_dir) / "model.safetensors")


def test_k0_is_the_synchronous_loop_bit_for_bit(tiny_yaml, tmp_path):
    plain = _cfg(tiny_yaml, tmp_path / "plain", "train.steps=2")
    k0 = _cfg(tiny_yaml, tmp_path / "k0", "train.steps=2", "rollout.max_staleness=0")
    train(plain)
    train(k0)
    a, b = _metrics(plain.run_dir), _metrics(k0.run_dir)
    assert sorted(a) == sorted(b) == [1, 2]
    for step in a:
        # what the clock and the allocator say differs run to run: stage seconds, tokens/s,
        # bandwidth and MFU, resident set per stage
        measured = ("time", "speed/", "memory/")
        same = {k for k in a[step] if not k.startswith(measured)}
        assert same == {k for k in b[step] if not k.startswith(measured)}
        assert not any(k.startswith("async/") for k in same)  # no sampler at all
        assert {k: a[step][k] for k in same} == {k: b[step][k] for k in same}
    wa, wb = _weights(plain.run_dir), _weights(k0.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_k1_trains_no_batch_older_than_k(tiny_yaml, tmp_path):
    cfg = _cfg(tiny_yaml, tmp_path, "train.steps=4", "rollout.max_staleness=1")
    train(cfg)
    m = _metrics(cfg.run_dir)
    assert sorted(m) == [1, 2, 3, 4]
    assert all(m[s]["async/staleness"] <= 1 for s in m)
    assert m[1]["async/staleness"] == 0  # the first batch waits for version 0
    assert m[4]["async/staleness_max"] <= 1 and m[4]["async/requeued"] == 0
    assert m[4]["async/staleness_0"] + m[4]["async/staleness_1"] == 4
    assert m[4]["async/staleness_1"] >= 1  # it did run ahead: a batch trained one version late
    ids = _trained_ids(cfg.run_dir)
    assert all(len(v) == 2 * 4 for v in ids.values())  # tiny: 2 prompts x G = 4 per step
    assert all(torch.isfinite(torch.tensor(m[s]["loss/loss"])) for s in m)


def _trainer(tiny_yaml, tmp_path, *overrides) -> Trainer:
    trainer = Trainer(_cfg(tiny_yaml, tmp_path, "train.steps=6", "rollout.max_staleness=1",
                           *overrides))
    trainer.policy.fix_reference()
    return trainer


def test_a_stale_batch_goes_back_to_the_queue_never_to_the_floor(tiny_yaml, tmp_path):
    trainer = _trainer(tiny_yaml, tmp_path)
    sampler = trainer.sampler
    try:
        sampler.take(0)  # submits two jobs: one taken, one drawn ahead at version 0
        waiting = [list(j.indices) for j in sampler._outstanding]
        assert len(waiting) == 1
        for v in (1, 2, 3):  # the trainer moves on three versions without taking
            sampler.publish(v)
        batch, metrics = sampler.take(3)
        assert metrics["async/requeued"] >= 1 and metrics["async/staleness"] <= 1
        again, metrics = sampler.take(3)
        assert metrics["async/staleness"] <= 1
        ids = lambda b: {p.sample.id for p in b.prompts}  # noqa: E731
        # The stale batch's prompts were drawn again and trained, not replaced by fresh ones.
        assert {trainer.prompts.dataset[i].id for i in waiting[0]} <= ids(batch) | ids(again)
    finally:
        trainer.close()


def test_a_skipped_weight_sync_is_detected(tiny_yaml, tmp_path, monkeypatch):
    # The sampler process is never told of a version past 0, so it keeps its first weights:
    # the version check stops the run at the first batch it draws with them after version 1.
    draw = async_worker.ProcessWorker.draw
    monkeypatch.setattr(async_worker.ProcessWorker, "draw",
                        lambda self, prompts, published: draw(self, prompts, min(published, 0)))
    trainer = _trainer(tiny_yaml, tmp_path)
    try:
        trainer.train_step()
        with pytest.raises(RuntimeError, match="skipped a weight sync"):
            for _ in range(3):
                trainer.train_step()
    finally:
        trainer.close()


def test_an_incomplete_lora_sync_is_detected(tiny_yaml, tmp_path, monkeypatch):
    # The version moves on but one adapter tensor of the staged copy keeps its old value (what a
    # sync that forgets a LoRA weight does): the sampler's fingerprint differs from the trainer's.
    publish = async_rollout.WeightBox.publish

    def forgetful(self, model, version):
        old = self.staging[self.names[-1]].clone()
        publish(self, model, version)
        if version > 0:
            with self.lock:
                self.staging[self.names[-1]].copy_(old)

    monkeypatch.setattr(async_rollout.WeightBox, "publish", forgetful)
    trainer = _trainer(tiny_yaml, tmp_path, "model.lora={r: 4, alpha: 8}")
    try:
        assert all("lora_" in n for n in trainer.sampler.weights.names)
        with pytest.raises(RuntimeError, match="fingerprint mismatch"):
            for _ in range(4):
                trainer.train_step()
    finally:
        trainer.close()


def test_resume_with_batches_in_flight_trains_each_prompt_once(tiny_yaml, tmp_path):
    common = ["train.steps=4", "train.save_every=2", "train.keep_checkpoints=0",
              "rollout.max_staleness=1"]
    full = _cfg(tiny_yaml, tmp_path / "full", *common)
    train(full)
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    src = full.run_dir / "checkpoints" / "step_000002"
    state = torch.load(src / "trainer_state.pt", weights_only=False)
    assert len(state["extra"][async_rollout.IN_FLIGHT]["pending"]) == 1  # drawn, not trained
    subprocess.run(["cp", "-r", str(src), str(resumed_dir / "checkpoints")], check=True)
    train(_cfg(tiny_yaml, resumed_dir, *common, "train.resume=auto"))
    a, b = _trained_ids(full.run_dir), _trained_ids(resumed_dir)
    assert sorted(b) == [3, 4]
    for step in (3, 4):  # the in-flight batch first, then the next prompts: as uninterrupted
        assert sorted(b[step]) == sorted(a[step])
    every = [i for s in (1, 2) for i in a[s]] + [i for s in (3, 4) for i in b[s]]
    assert len(set(every)) == len(every) // 4  # each prompt once (G = 4 rows per prompt)


def test_sigterm_saves_the_batches_in_flight_and_the_resume_trains_each_prompt_once(
        tiny_yaml, user_rewards, tmp_path):
    import os
    import signal
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(user_rewards)]))
    cli = [sys.executable, "-m", "mmrl.cli", "train", str(tiny_yaml), f"log.run_dir={run_dir}",
           *QUIET, VARIETY, "rollout.max_staleness=1"]
    proc = subprocess.Popen(cli + ["train.steps=200"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    log = run_dir / "metrics.jsonl"
    while not (log.is_file() and log.read_text().strip()):  # a step logged: more in flight
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "no step logged"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err
    done = max(_metrics(run_dir))
    state = torch.load(checkpoint.latest(run_dir) / "trainer_state.pt", weights_only=False)
    assert state["step"] == done and state["extra"][async_rollout.IN_FLIGHT]["pending"]
    resumed = subprocess.run(cli + [f"train.steps={done + 2}", "train.resume=auto"], cwd=root,
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ids = _trained_ids(run_dir)
    assert sorted(ids) == list(range(1, done + 3))
    every = [i for s in ids for i in ids[s]]
    assert len(set(every)) == len(every) // 4  # each prompt trained once (G = 4)
