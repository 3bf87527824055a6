"""The trainer end to end on a tiny offline Qwen2.5-VL: parameters move (vision tower included),
micro-batching does not change the update, resume continues bit-for-bit, and a process killed
while writing a checkpoint leaves the previous one loadable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrl import config
from mmrl.train import checkpoint
from mmrl.train.loop import Trainer
from mmrl.train.run import train

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# accuracy and format as configured; VARIETY where a test needs reward variance from a random
# model (tests/conftest.py, USER_REWARDS).
VARIETY = "rewards=[{name: 'mmrl_test_rewards:char_variety'}]"


@pytest.fixture(scope="module")
def tiny_yaml(tiny_config, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return tiny_config(root / "tiny.yaml", root / "data",
                       data={"eval": "{data}/eval.jsonl",
                             "generate_kwargs": {"n_train": 48, "n_eval": 8}},
                       rewards=[{"name": "accuracy"},
                                {"name": "format", "weight": 0.5, "params": {"think": False}}],
                       log={"rollouts_every": 1})


def _cfg(tiny_yaml: Path, run_dir: Path, *overrides: str) -> config.RunConfig:
    return config.load(tiny_yaml, [f"log.run_dir={run_dir}", *overrides])


def test_step_changes_parameters_and_vision_tower_gets_gradient(tiny_yaml, tmp_path):
    t = Trainer(_cfg(tiny_yaml, tmp_path, VARIETY))
    before = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    metrics = t.train_step()
    assert metrics["adv/abs_mean"] > 0, "no reward variance: the test would prove nothing"
    changed = {k for k, v in t.policy.model.named_parameters() if not torch.equal(v, before[k])}
    assert any(k.startswith("model.visual") for k in changed), "vision tower got no update"
    assert any("language_model" in k for k in changed)
    for key in ("loss/loss", "loss/clip_frac_low", "entropy", "completion/length_mean",
                "groups/zero_std_frac", "time/rollout", "time/update", "time/tokens_per_s"):
        assert key in metrics and metrics[key] == metrics[key], key  # present and not NaN
    t.close()


def test_micro_batch_size_does_not_change_the_update(tiny_yaml, tmp_path):
    """Same rollout, accumulated over 1 micro-batch of 8 rows vs 4 of 2 rows: same gradients.
    (Compared before the optimizer: Adam turns float noise in near-zero gradients into full-size
    steps, so parameters would differ more than the gradients do.)"""
    grads = []
    for mb in (8, 2):
        t = Trainer(_cfg(tiny_yaml, tmp_path / f"mb{mb}", VARIETY, f"train.micro_batch_size={mb}",
                         "algo.agg=token_mean"))
        seen = {}
        step = t.learner.optimizer.step

        def capture(*a, **kw):
            seen.update({k: p.grad.clone() for k, p in t.policy.model.named_parameters()
                         if p.grad is not None})
            return step(*a, **kw)

        t.learner.optimizer.step = capture
        torch.manual_seed(0)
        t.train_step()
        grads.append(seen)
        t.close()
    assert grads[0].keys() == grads[1].keys() and any(k.startswith("model.visual") for k in grads[0])
    for k in grads[0]:
        scale = float(grads[0][k].abs().max()) + 1e-12
        assert float((grads[0][k] - grads[1][k]).abs().max()) / scale < 1e-5, k


def test_varlen_shared_prefix_update_equals_the_naive_one(tiny_yaml, tmp_path):
    """The trainer on the varlen kernel (its CPU emulation: what flash_attention_2 becomes on a
    GPU) gives the naive layout's gradients, and says so in its metrics."""
    grads, flags = [], []
    for name, overrides in (("naive", ["train.shared_prefix=false"]),
                            ("varlen", ["model.attn_implementation=mmrl_prefix_varlen"])):
        t = Trainer(_cfg(tiny_yaml, tmp_path / name, VARIETY, "algo.agg=token_mean",
                         "train.micro_batch_size=3", *overrides))
        seen = {}
        step = t.learner.optimizer.step

        def capture(*a, **kw):
            seen.update({k: p.grad.clone() for k, p in t.policy.model.named_parameters()
                         if p.grad is not None})
            return step(*a, **kw)

        t.learner.optimizer.step = capture
        torch.manual_seed(0)
        metrics = t.train_step()
        flags.append((metrics["train/shared_prefix"], metrics.get("train/pad_fraction")))
        grads.append(seen)
        t.close()
    assert flags == [(0.0, None), (1.0, 0.0)]
    assert grads[0].keys() == grads[1].keys() and any(k.startswith("model.visual") for k in grads[0])
    for k in grads[0]:
        scale = float(grads[0][k].abs().max()) + 1e-12
        assert float((grads[0][k] - grads[1][k]).abs().max()) / scale < 1e-5, k


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def test_resume_equals_uninterrupted_run(tiny_yaml, tmp_path):
    common = ["train.steps=4", "train.save_every=2", "train.keep_checkpoints=0",
              VARIETY]
    full = _cfg(tiny_yaml, tmp_path / "full", *common)
    train(full)
    # A second run dir that starts from the uninterrupted run's step-2 checkpoint.
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    src = full.run_dir / "checkpoints" / "step_000002"
    subprocess.run(["cp", "-r", str(src), str(resumed_dir / "checkpoints")], check=True)
    train(_cfg(tiny_yaml, resumed_dir, *common, "train.resume=auto"))
    a, b = _metrics(full.run_dir), _metrics(resumed_dir)
    assert sorted(b) == [3, 4]
    for step in (3, 4):
        assert b[step]["loss/loss"] == a[step]["loss/loss"]
        assert b[step]["reward/total_mean"] == a[step]["reward/total_mean"]
    wa = checkpoint.latest(full.run_dir) / "model.safetensors"
    wb = checkpoint.latest(resumed_dir) / "model.safetensors"
    from safetensors.torch import load_file

    ta, tb = load_file(wa), load_file(wb)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_sigkill_during_checkpoint_write_keeps_previous(tiny_yaml, tmp_path):
    run_dir = tmp_path / "killed"
    cli = [sys.executable, "-m", "mmrl.cli", "train", str(tiny_yaml), f"log.run_dir={run_dir}",
           "eval.before_rl=false", "data.eval=null"]
    first = subprocess.run(cli + ["train.steps=1"], cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert checkpoint.latest(run_dir).name == "step_000001"
    flag = tmp_path / "writing"
    env = dict(os.environ, MMRL_TEST_CHECKPOINT_DELAY="60", MMRL_TEST_CHECKPOINT_FLAG=str(flag))
    proc = subprocess.Popen(cli + ["train.steps=2", "train.resume=auto"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not flag.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "checkpoint write never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(p.name.startswith(".tmp-step_000002") for p in (run_dir / "checkpoints").iterdir())
    assert checkpoint.latest(run_dir).name == "step_000001"  # the half-written one is invisible
    done = subprocess.run(cli + ["train.steps=2", "train.resume=auto"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stderr and "step_000001" in done.stderr
    assert checkpoint.latest(run_dir).name == "step_000002"


def test_summary_and_rollouts_written(tiny_yaml, tmp_path):
    summary = train(_cfg(tiny_yaml, tmp_path, "eval.before_rl=true", "eval.shuffled_images=true"),
                    predicted={"update": 2 ** 30})  # what `mmrl train` passes on CUDA
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    # measured peak per stage beside the plan's (train/memory.py); on CPU the resident set
    stages = on_disk["memory"]["stages"]
    assert {"rollout", "logprob", "advantage", "update", "sync"} <= set(stages)
    assert all(v["measured_gib"] > 0 for v in stages.values())
    assert stages["update"]["predicted_gib"] == 1.0 and stages["rollout"]["predicted_gib"] is None
    metrics = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(m["memory/update_gib"] > 0 for m in metrics if "memory/rollout_gib" in m)
    assert sum("memory/rollout_gib" in m for m in metrics) == 2
    for key in ("accuracy_before_rl", "accuracy_after_rl", "accuracy_shuffled_images", "chance"):
        assert key in on_disk and 0.0 <= on_disk[key] <= 1.0
    assert on_disk["steps"] == summary["steps"] == 2
    rollouts = [json.loads(ln) for ln in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and {"completion", "answer", "rewards", "advantage", "images"} <= set(rollouts[0])
    assert Path(rollouts[0]["images"][0]).is_file()  # media referenced by path, not copied
    saved = config.load(tmp_path / "config.yaml")
    assert saved.rollout.num_generations == 4
    # Where the seconds went: per step in metrics.jsonl, summed in summary.json (docs/performance.md).
    step = _metrics(tmp_path)[2]
    stages = ("rollout", "scoring", "logprob", "advantage", "update", "sync")
    assert abs(sum(step[f"time/{k}"] for k in stages) - step["time/step"]) < 1e-6
    assert 0 < step["time/rollout_prefill"] + step["time/rollout_decode"] <= step["time/rollout"]
    for key in ("speed/generated_tokens_per_s", "speed/decode_bytes_per_s",
                "speed/decode_bandwidth_share", "speed/update_mfu"):
        assert step[key] > 0, key
    phases = on_disk["phases"]
    assert phases["steps"] == 2 and 0 < phases["decode_bandwidth_share"]
    assert abs(sum(phases["share"][k] for k in stages) - 1) < 1e-6


def test_a_policy_that_never_ends_its_completions_is_warned_about(tiny_yaml, tmp_path):
    """One token of budget: the random tiny policy never reaches end-of-sequence, every
    completion is cut, and after CUT_STEPS steps the run says so, once, in warnings.txt."""
    from mmrl.train.watch import CUT_STEPS

    t = Trainer(_cfg(tiny_yaml, tmp_path, VARIETY, "rollout.max_new_tokens=1"))
    cut = [t.train_step()["completion/truncated_frac"] for _ in range(CUT_STEPS + 2)]
    t.close()
    assert min(cut) == 1.0, cut
    warned = (tmp_path / "warnings.txt").read_text()
    assert warned.count("of completions hit rollout.max_new_tokens (1) for 10 steps") == 1


def test_sft_warm_up_stops_after_stop_checks_readings_in_a_row(tiny_yaml, tmp_path):
    """stop_accuracy 0 is reached at every check, so the warm-up runs exactly stop_checks."""
    from mmrl.train.sft import sft_warmup

    for checks in (1, 3):
        t = Trainer(_cfg(tiny_yaml, tmp_path / str(checks), "sft.steps=8", "sft.eval_every=1",
                         "sft.batch_size=4", "sft.stop_accuracy=0.0", f"sft.stop_checks={checks}"))
        out = sft_warmup(t.cfg, t.policy, t.prompts, t.log)
        t.close()
        assert out["steps"] == checks and [h["step"] for h in out["history"]] == list(
            range(1, checks + 1))


def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_yaml, tmp_path):
    """DAPO preset: prompts whose solution is 1 or 2 get a constant reward (zero-variance groups);
    the sampler must drop them and draw more prompts until the batch is full."""
    t = Trainer(_cfg(tiny_yaml, tmp_path, "rewards=[{name: 'mmrl_test_rewards:variety_above_two'}]",
                     "algo.preset=dapo", "rollout.prompts_per_step=3"))
    batch, scores, _, extra = t.sample_batch()
    solutions = {p.sample.solution for p in batch.prompts}
    assert solutions <= {"3", "4"}, solutions
    assert batch.n == 3 * 4 and len(batch.group_ids.unique()) == 3
    assert extra["sampling/rounds"] >= 1
    from mmrl import algos

    assert algos.frac_zero_std_groups(scores, batch.group_ids) == 0.0
    metrics = t.learn(batch, scores, {"variety_above_two": scores.tolist()})
    assert metrics["groups/zero_std_frac"] == 0.0
    t.close()


def test_freeze_vision_keeps_the_tower(tiny_yaml, tmp_path):
    t = Trainer(_cfg(tiny_yaml, tmp_path, VARIETY, "model.freeze=[vision]"))
    before = {k: v.detach().clone() for k, v in t.policy.model.named_parameters()}
    t.train_step()
    for k, v in t.policy.model.named_parameters():
        if k.startswith("model.visual."):
            assert torch.equal(v, before[k]), k
    assert any(not torch.equal(v, before[k]) for k, v in t.policy.model.named_parameters())
    t.close()


def test_num_iterations_reuses_the_rollout_with_stored_old_logprobs(tiny_yaml, tmp_path):
    """Two updates per rollout: the first is on-policy (ratio 1), the second sees the moved policy
    against the stored old logprobs (ratio != 1), and both optimizer steps happen."""
    t = Trainer(_cfg(tiny_yaml, tmp_path, VARIETY, "algo.num_iterations=2"))
    steps = []
    step = t.learner.optimizer.step

    def count(*a, **kw):
        steps.append(1)
        return step(*a, **kw)

    t.learner.optimizer.step = count
    metrics = t.train_step()
    assert len(steps) == 2
    assert metrics["loss/ratio_max"] > 1.0 + 1e-6 or metrics["loss/ratio_min"] < 1.0 - 1e-6
    t.close()
