"""`mmrl train`: [SFT warm-up] -> evaluate before RL -> RL steps -> evaluate after -> summary.json.

Every stage's result is stored in the checkpoint's trainer state, so a resumed run neither
repeats the warm-up nor re-measures the "before" accuracy on an already-trained model.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from mmrl.benchmarks.runner import check_copies, run_due, summary_rows
from mmrl.config import RunConfig
from mmrl.train import dist, lora, memory, rundir, speed
from mmrl.train.evaluate import evaluate, majority_baseline
from mmrl.train.logging import RunLogger, json_safe
from mmrl.train.loop import FROM_CONFIG, Trainer
from mmrl.train.policy import Policy
from mmrl.train.sft import sft_warmup
from mmrl.train.signals import StepAbandoned, StopNow, StopSignals
from mmrl.train.watch import SampledVsGreedy
from mmrl.types import Sample


UNLOGGED = "unlogged_step"  # state_extra: a step's metrics whose periodic evaluation a stop cut


class RunInterrupted(Exception):
    """A stop signal (signals.py): what was saved and how to resume; `exit_code` 128 + signal."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


def resume_command(cfg: RunConfig) -> str:
    """The command line that continues this run (the CLI's own arguments when run through it)."""
    args = sys.argv[1:] if sys.argv[1:2] == ["train"] else ["train", "CONFIG"]
    args = [a for a in args if not a.startswith(("train.resume=", "train.overwrite="))]
    if not any(a.startswith("log.run_dir=") for a in args):
        args.append(f"log.run_dir={cfg.run_dir}")
    return shlex.join(["mmrl", *args, "train.resume=auto"])  # a folder may hold a space


def _eval(policy: Policy, eval_set: list[Sample], cfg: RunConfig, out_dir: Path, name: str,
          **kw) -> dict:
    """Held-out evaluation, each rank drawing its share of the records; every rank gets the
    result, rank 0 writes eval/NAME.jsonl."""
    with policy.full_params():  # sharded weights: gathered on every rank
        return evaluate(policy.model, policy.codec, eval_set, cfg,
                        out_file=out_dir / "eval" / f"{name}.jsonl", info=policy.info, **kw)


def train(cfg: RunConfig, predicted: dict | None = None) -> dict:
    """One run in `cfg.run_dir`, which rank 0 holds locked while it runs. `predicted`: the memory
    plan's peak bytes per stage (`mmrl train` makes it on CUDA), reported beside the measured."""
    if int(os.environ.get("RANK", "0")) != 0:
        return _train(cfg, FROM_CONFIG, predicted)  # the checkpoint rank 0 chose, broadcast
    with rundir.locked(cfg.run_dir):  # the run dir is rank 0's to check and write
        return _train(cfg, rundir.prepare(cfg), predicted)


def _train(cfg: RunConfig, resume, predicted: dict | None = None) -> dict:
    started = time.perf_counter()
    # One process may stop anywhere; ranks stop together at step boundaries (signals.py).
    single = int(os.environ.get("WORLD_SIZE", "1")) == 1
    with StopSignals(cfg.train.stop_timeout, can_abandon=single) as stop:
        trainer = Trainer(cfg, resume=resume)
        trainer.stop = stop if single else None
        trainer.memory = memory.PhasePeaks(torch.cuda.is_available())
        try:
            summary = _stages(trainer, stop, started, single)
            summary["memory"] = memory.summary(trainer.memory, predicted)
        except torch.OutOfMemoryError as e:
            raise RuntimeError(
                f"out of memory at step {trainer.step + 1}: lower train.micro_batch_size (rows "
                f"per forward), set model.gradient_checkpointing=true, lower "
                f"rollout.num_generations or rollout.max_new_tokens, or reduce "
                f"data.image_max_pixels. Resume with train.resume=auto; the last checkpoint is "
                f"intact.") from e
        finally:
            trainer.close()
    if trainer.info.main:
        (trainer.run_dir / "summary.json").write_text(
            json.dumps(json_safe(summary), indent=2, allow_nan=False))
        _print_table(trainer.log, trainer.run_dir, summary)
    return summary


def _stages(trainer: Trainer, stop: StopSignals, started: float, single: bool) -> dict:
    """[SFT warm-up] -> evaluate before RL -> RL steps -> evaluate after; each stage stops on a
    signal where it can (signals.py) -> the summary."""
    cfg, log, policy, evals = trainer.cfg, trainer.log, trainer.policy, trainer.eval_set
    summary = trainer.state_extra.setdefault("summary", {})
    asked = lambda: _all_ranks(trainer.info, stop.requested)  # noqa: E731  a collective
    check_copies(cfg)  # a benchmark's missing download fails now, not after the warm-up

    def run_eval(name: str, **kw) -> dict:
        with stop.interruptible(single):
            return _eval(policy, evals, cfg, trainer.run_dir, name, envs=trainer.envs, **kw)

    def halt(what: str, save: bool = True, why: str = ""):
        summary["wall_seconds"] = summary.get("wall_seconds", 0.0) + time.perf_counter() - started
        log.stop()
        if save:
            trainer.save()
        dist.destroy(trainer.info)  # the ranks stop together here: leave the group before exit
        kept = (f"checkpoint saved in {trainer.run_dir / 'checkpoints'} (step {trainer.step})"
                if save else f"nothing saved{why}")
        raise RunInterrupted(f"{stop.name or 'interrupt'}: stopped {what}; {kept}. Resume with: "
                             f"{resume_command(cfg)}", stop.exit_code)

    if trainer.step == 0 and cfg.sft.steps > 0 and "sft" not in summary:
        result = sft_warmup(cfg, policy, trainer.prompts, log, stop=asked)
        if result.get("stopped"):
            halt(f"in the SFT warm-up after its step {result['steps']} of {cfg.sft.steps}",
                 save=False, why=" (the warm-up keeps no checkpoint: it starts over on resume)")
        summary["sft"] = result
        trainer.sync_engine()
    if evals and cfg.eval.before_rl and "accuracy_before_rl" not in summary:
        try:
            summary["eval_before_rl"] = run_eval("before_rl")
        except StopNow:  # the warm-up's weights are worth keeping; the evaluation is redone
            halt("in the evaluation before RL", save="sft" in summary,
                 why=" (no step had run)")
        summary["accuracy_before_rl"] = summary["eval_before_rl"]["accuracy"]
        log.print(f"accuracy before RL: {_accuracy_text(summary['eval_before_rl'])}")
    if cfg.eval.benchmarks and "benchmarks_before_rl" not in summary:
        summary["benchmarks_before_rl"] = run_due(policy, cfg, trainer.run_dir, "before_rl", 0,
                                                  trainer.envs)
    policy.fix_reference()
    _rl_steps(trainer, run_eval if evals else None, summary, asked, halt)
    if asked():
        halt("after the last step, before the evaluation after RL (it runs on resume)")
    if evals:
        try:
            summary["eval_after_rl"] = run_eval("after_rl")
            if cfg.eval.shuffled_images:
                res = run_eval("after_rl_shuffled_images", shuffled=True)
                summary["accuracy_shuffled_images"] = res["accuracy"]
                summary["chance"] = majority_baseline(evals)
        except StopNow:
            halt("in the evaluation after RL (it runs again on resume)")
        summary["accuracy_after_rl"] = summary["eval_after_rl"]["accuracy"]
    if cfg.eval.benchmarks:
        summary["benchmarks_after_rl"] = run_due(policy, cfg, trainer.run_dir, "after_rl",
                                                 trainer.step, trainer.envs)
    summary["steps"] = trainer.step
    summary["wall_seconds"] = summary.get("wall_seconds", 0.0) + time.perf_counter() - started
    summary["skipped_records"] = trainer.prompts.skip_summary()
    summary["phases"] = trainer.phases.summary()  # this process's steps (a resume: since it)
    trainer.save()
    if policy.to_save is not policy.model and trainer.info.main:  # LoRA: its wrapper
        summary["merged_model"] = str(lora.export_merged(
            policy.to_save, policy.codec.processor, trainer.run_dir / "merged"))
    dist.destroy(trainer.info)
    return summary


def _rl_steps(trainer: Trainer, run_eval, summary: dict, asked, halt) -> None:
    """The RL steps, each finished (or, on one process, abandoned and rewound) before a stop."""
    tc, log = trainer.cfg.train, trainer.log
    # A resumed run's policy is no longer the one measured before RL: no comparison.
    gap = SampledVsGreedy(trainer.cfg.eval.metric_reward, summary.get("accuracy_before_rl")
                          if trainer.step == 0 else None, trainer.cfg.rollout.temperature,
                          log.warn)
    log.start(total=tc.steps, done=trainer.step)
    unlogged = trainer.state_extra.pop(UNLOGGED, None)  # a stop cut its periodic evaluation
    while unlogged is not None or trainer.step < tc.steps:
        if asked():
            halt(f"after step {trainer.step}")
        try:
            if unlogged is not None:
                metrics, unlogged = unlogged, None
                _finish_step(trainer, metrics, run_eval)
            else:
                gap.observe(_rl_step(trainer, run_eval))
        except StepAbandoned:
            trainer.rewind()
            halt(f"in step {trainer.step + 1}, abandoned after train.stop_timeout="
                 f"{tc.stop_timeout:g} s (it is redone on resume)")
        except StopNow:
            halt(f"after step {trainer.step}, in its evaluation (it runs on resume, and the "
                 f"step is logged with it)")
    log.stop()


def _accuracy_text(result: dict) -> str:
    """`0.625`, or why there is no number (no eval record was scored)."""
    acc = result.get("accuracy")
    if isinstance(acc, float) and acc == acc:
        return f"{acc:.3f}"
    return f"n/a ({result.get('unscored_reason') or 'no eval record was scored'})"


def _rl_step(trainer: Trainer, run_eval) -> dict:
    """One step, its periodic evaluation (`run_eval`, None without an eval set), its log line,
    the non-finite guard and the periodic checkpoint -> the step's metrics."""
    metrics = trainer.train_step()
    _finish_step(trainer, metrics, run_eval)
    return metrics


def _finish_step(trainer: Trainer, metrics: dict, run_eval) -> None:
    """A trained step's periodic evaluation, its log line, the non-finite guard and the periodic
    checkpoint. A stop inside the evaluation keeps the step's metrics in the checkpoint
    (UNLOGGED), so the resumed run evaluates and logs that step whole, once."""
    tc = trainer.cfg.train
    if tc.eval_every and run_eval is not None and trainer.step % tc.eval_every == 0:
        try:
            res = run_eval(f"step_{trainer.step:06d}")
        except StopNow:
            trainer.state_extra[UNLOGGED] = json_safe(metrics)
            raise
        metrics.update({f"eval/{k}": v for k, v in res.items() if k != "n"})
    metrics.update(run_due(trainer.policy, trainer.cfg, trainer.run_dir,
                           f"step_{trainer.step:06d}", trainer.step, trainer.envs))
    trainer.log.log(trainer.step, metrics, total=tc.steps)
    trainer.check_finite()
    if tc.save_every and trainer.step % tc.save_every == 0 and trainer.step < tc.steps:
        trainer.save()


def _all_ranks(info: dist.DistInfo, flag: bool) -> bool:
    """True on every rank when any rank was asked to stop (they must save together)."""
    return bool(dist.all_sum(float(flag), info) > 0) if info.enabled else flag


def _print_table(log: RunLogger, run_dir: Path, summary: dict) -> None:
    rows = [(k, f"{summary[k]:.3f}") for k in ("accuracy_before_rl", "accuracy_after_rl",
                                                "accuracy_shuffled_images", "chance")
            if isinstance(summary.get(k), (int, float))]
    rows += summary_rows(summary)  # the field benchmarks, before -> after RL
    rows.append(("steps", str(summary.get("steps"))))
    skipped = (summary.get("skipped_records") or {}).get("count")
    if skipped:
        rows.append(("skipped records", f"{skipped} (summary.json: skipped_records)"))
    rows += memory.summary_rows(summary.get("memory") or {})
    rows.append(("wall time", f"{summary.get('wall_seconds', 0.0) / 60:.1f} min"))
    rows += speed.phase_rows(summary.get("phases") or {})
    rows.append(("run dir", str(run_dir)))
    log.summary_table("mmrl run summary", rows)
