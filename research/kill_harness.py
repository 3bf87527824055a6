"""Random SIGKILLs and SIGTERMs against real `mmrl train` processes, each followed by a resume,
compared with one uninterrupted run of the same config.

    python research/kill_harness.py --out /tmp/kh --interruptions 30 [--seed 0]

Each trial starts a tiny run (24 counting records, 12 steps, a checkpoint every 2 steps, an
evaluation every 4), and interrupts it `--per-trial` times at random moments once it trains
(SIGKILL or SIGTERM, alternating from a random first one), resuming with `train.resume=auto` each
time, then lets it finish. Checkpoint writes are widened with the test-only
MMRL_TEST_CHECKPOINT_DELAY (1 s) so some signals land inside them, and scoring sleeps 0.3 s with
`train.stop_timeout=0.3`, so some SIGTERMs abandon a rollout.

A trial survives when its metrics.jsonl holds each step exactly once with every value equal to
the uninterrupted run's (timings excepted) and its final weights are bit-identical. Figures:
kills and terms survived / tried, where each signal landed (a checkpoint write, a rollout
abandoned, a step finished), the steps redone after a SIGKILL (work since the last checkpoint)
and after a SIGTERM (none but an abandoned rollout), and the metric values lost or changed.
Results go to OUT/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12
CONFIG = """
name: kill_harness
data: {{train: {data}/train.jsonl, eval: {data}/eval.jsonl, on_bad_sample: skip}}
model: {{family: qwen2_5_vl, path: tiny, tiny: {{min_pixels: 3136, max_pixels: 3136}}}}
rollout: {{prompts_per_step: 2, num_generations: 2, max_new_tokens: 4}}
rewards: [{{name: 'kh_rewards:variety'}}]
train: {{steps: {steps}, lr: 1.0e-3, save_every: 2, keep_checkpoints: 2, eval_every: 4,
         stop_timeout: 0.3}}
eval: {{before_rl: false}}
log: {{progress: lines, tensorboard: false, rollouts_every: 1, log_every: 1}}
"""
REWARD = """
import time
def variety(completions, solution, **fields):
    time.sleep(0.3)
    return [len(set(c)) / 10 for c in completions]
"""


def _env(out: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(out)]),
                OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                MMRL_TEST_CHECKPOINT_DELAY="1")


def _cmd(config: Path, run_dir: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "mmrl.cli", "train", str(config), f"log.run_dir={run_dir}",
            f"train.resume={'auto' if resume else 'none'}"]


def _rows(run_dir: Path) -> list[dict]:
    """The rows of metrics.jsonl (a line cut short by a SIGKILL is not one)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _values(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "time" and not k.startswith("time/")}


def _interrupt(config: Path, run_dir: Path, env: dict, signum: int, rng: random.Random) -> dict:
    """One process, resumed, signalled at a random moment once it trains -> what happened."""
    before = len(_rows(run_dir))
    proc = subprocess.Popen(_cmd(config, run_dir, resume=True), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while len(_rows(run_dir)) <= before and proc.poll() is None:  # training has started
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 3.0))
    if proc.poll() is not None:
        return {"signal": None, "finished": True, "stderr": proc.communicate()[1][-500:]}
    ckpts = run_dir / "checkpoints"
    in_write = ckpts.is_dir() and any(p.name.startswith(".tmp-") for p in ckpts.iterdir())
    step_at_signal = len(_rows(run_dir))
    proc.send_signal(signum)
    err = proc.communicate(timeout=300)[1]
    return {"signal": signal.Signals(signum).name, "exit": proc.returncode,
            "in_checkpoint_write": in_write, "logged_at_signal": step_at_signal,
            "abandoned": "abandoned after train.stop_timeout" in err,
            "in_eval": "in its evaluation" in err, "stderr": err.strip().splitlines()[-1:]}


def _trial(config: Path, run_dir: Path, env: dict, per_trial: int, first: int,
           rng: random.Random) -> list[dict]:
    events, signum = [], first
    for _ in range(per_trial):
        event = _interrupt(config, run_dir, env, signum, rng)
        if event.get("finished"):
            break
        resumed_from = subprocess.run(  # what the next process resumes from
            [sys.executable, "-c", "import sys; from mmrl.train import checkpoint; "
             "c = checkpoint.latest(sys.argv[1]); print(int(c.name[5:]) if c else 0)",
             str(run_dir)], env=env, capture_output=True, text=True).stdout.strip()
        event["checkpoint_step"] = int(resumed_from or 0)
        event["steps_redone"] = max(0, event["logged_at_signal"] - event["checkpoint_step"])
        events.append(event)
        signum = signal.SIGTERM if signum == signal.SIGKILL else signal.SIGKILL
    done = subprocess.run(_cmd(config, run_dir, resume=True), cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        events.append({"signal": None, "error": done.stderr[-1000:]})
    return events


def _compare(ref_dir: Path, run_dir: Path) -> dict:
    from safetensors.torch import load_file

    ref, got = _rows(ref_dir), _rows(run_dir)
    steps = [r["step"] for r in got]
    lost = changed = 0
    by_step = {r["step"]: _values(r) for r in got}
    for row in ref:
        mine = by_step.get(row["step"])
        if mine is None:
            lost += len(_values(row))
            continue
        changed += sum(mine.get(k) != v for k, v in _values(row).items())
    weights = [load_file(d / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors")
               for d in (ref_dir, run_dir)]
    same = weights[0].keys() == weights[1].keys() and all(
        bool((weights[0][k] == weights[1][k]).all()) for k in weights[0])
    return {"steps_logged_once": steps == list(range(1, STEPS + 1)), "values_lost": lost,
            "values_changed": changed, "values_compared": sum(len(_values(r)) for r in ref),
            "weights_identical": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--interruptions", type=int, default=30)
    ap.add_argument("--per-trial", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from mmrl.data.synthetic import GENERATORS

    out, rng = Path(args.out), random.Random(args.seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kh_rewards.py").write_text(REWARD)
    GENERATORS.get("counting")(out / "data", n_train=24, n_eval=4)
    config = out / "config.yaml"
    config.write_text(CONFIG.format(data=out / "data", steps=STEPS))
    env = _env(out)
    ref = subprocess.run(_cmd(config, out / "ref", resume=False), cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if ref.returncode != 0:
        sys.exit(f"the uninterrupted run failed:\n{ref.stderr[-2000:]}")
    trials, tried = [], 0
    while tried < args.interruptions:
        run_dir = out / f"trial_{len(trials):02d}"
        first = rng.choice([signal.SIGKILL, signal.SIGTERM])
        events = _trial(config, run_dir, env, min(args.per_trial, args.interruptions - tried),
                        first, rng)
        tried += sum(e.get("signal") is not None for e in events)
        trials.append({"run_dir": str(run_dir), "events": events, **_compare(out / "ref", run_dir)})
        print(json.dumps({k: v for k, v in trials[-1].items() if k != "events"}), flush=True)
    summary = _summarise(trials)
    (out / "results.json").write_text(json.dumps({"summary": summary, "trials": trials},
                                                 indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def _summarise(trials: list[dict]) -> dict:
    out = {}
    for name in ("SIGKILL", "SIGTERM"):
        hits = [(e, t) for t in trials for e in t["events"] if e.get("signal") == name]
        good = [e for e, t in hits if t["steps_logged_once"] and not t["values_lost"]
                and not t["values_changed"] and t["weights_identical"]
                and (name == "SIGKILL" or e["exit"] == 143)]
        out[name] = {"survived": len(good), "tried": len(hits),
                     "in_checkpoint_write": sum(e["in_checkpoint_write"] for e, _ in hits),
                     "rollout_abandoned": sum(e["abandoned"] for e, _ in hits),
                     "in_eval": sum(e["in_eval"] for e, _ in hits),
                     "steps_redone": sum(e["steps_redone"] for e, _ in hits)}
    out["values_compared"] = sum(t["values_compared"] for t in trials)
    out["values_lost"] = sum(t["values_lost"] for t in trials)
    out["values_changed"] = sum(t["values_changed"] for t in trials)
    out["errors"] = sum(1 for t in trials for e in t["events"] if "error" in e)
    return out


if __name__ == "__main__":
    sys.exit(main())
