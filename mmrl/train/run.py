"""`mmrl train`: [SFT warm-up] -> evaluate before RL -> RL steps -> evaluate after -> summary.json.

Every stage's result is stored in the checkpoint's trainer state, so a resumed run neither
repeats the warm-up nor re-measures the "before" accuracy on an already-trained model.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import torch

from mmrl.config import RunConfig
from mmrl.train.evaluate import evaluate, majority_baseline
from mmrl.train import dist, lora, rundir
from mmrl.train.logging import json_safe
from mmrl.train.loop import Trainer
from mmrl.train.sft import sft_warmup


class RunInterrupted(Exception):
    """Ctrl-C: the step finished and a checkpoint was saved; the message says how to resume."""


class _CtrlC:
    """The first SIGINT asks the loop to stop after the current step; the second aborts."""

    def __init__(self):
        self.requested, self._old = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self.handle)
        return self

    def handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupt: finishing this step, then saving a checkpoint (Ctrl-C again to abort "
              "without saving)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def resume_command(cfg: RunConfig) -> str:
    """The command line that continues this run (the CLI's own arguments when run through it)."""
    args = sys.argv[1:] if sys.argv[1:2] == ["train"] else ["train", "CONFIG"]
    args = [a for a in args if not a.startswith(("train.resume=", "train.overwrite="))]
    if not any(a.startswith("log.run_dir=") for a in args):
        args.append(f"log.run_dir={cfg.run_dir}")
    return " ".join(["mmrl", *args, "train.resume=auto"])


def _eval(trainer: Trainer, name: str, **kw) -> dict:
    """Held-out evaluation on rank 0 (the other ranks wait); NaN accuracy elsewhere."""
    result = {"accuracy": float("nan")}
    with trainer.parallel.full_params(trainer.model):  # sharded weights: gathered on every rank
        if trainer.dist.main:
            result = evaluate(trainer.model, trainer.processor, trainer.adapter,
                              trainer.eval_set, trainer.cfg,
                              out_file=trainer.run_dir / "eval" / f"{name}.jsonl", **kw)
        dist.barrier(trainer.dist)
    return result


def train(cfg: RunConfig) -> dict:
    started = time.perf_counter()
    if int(os.environ.get("RANK", "0")) == 0:  # the run dir is rank 0's to check and write
        rundir.prepare(cfg)
    trainer = Trainer(cfg)
    log, tc = trainer.log, cfg.train
    summary = trainer.state_extra.setdefault("summary", {})
    try:
        if trainer.step == 0 and cfg.sft.steps > 0 and "sft" not in summary:
            summary["sft"] = sft_warmup(trainer)
            trainer.sync_engine()
        if trainer.eval_set and cfg.eval.before_rl and "accuracy_before_rl" not in summary:
            summary["eval_before_rl"] = _eval(trainer, "before_rl")
            summary["accuracy_before_rl"] = summary["eval_before_rl"]["accuracy"]
            log.print(f"accuracy before RL: {summary['accuracy_before_rl']:.3f}")
        trainer.enable_reference()
        log.start(total=tc.steps, done=trainer.step)
        with _CtrlC() as ctrl_c:
            while trainer.step < tc.steps:
                _rl_step(trainer)
                if _all_ranks(trainer, ctrl_c.requested):
                    log.stop()
                    trainer.save()
                    raise RunInterrupted(
                        f"interrupted after step {trainer.step}; checkpoint saved in "
                        f"{trainer.run_dir / 'checkpoints'}. Resume with: {resume_command(cfg)}")
        log.stop()
        if trainer.eval_set:
            summary["eval_after_rl"] = _eval(trainer, "after_rl")
            summary["accuracy_after_rl"] = summary["eval_after_rl"]["accuracy"]
            if cfg.eval.shuffled_images:
                res = _eval(trainer, "after_rl_shuffled_images", shuffled=True)
                summary["accuracy_shuffled_images"] = res["accuracy"]
                summary["chance"] = majority_baseline(trainer.eval_set)
        summary["steps"] = trainer.step
        summary["wall_seconds"] = summary.get("wall_seconds", 0.0) + time.perf_counter() - started
        trainer.save()
        if trainer.peft is not None and trainer.dist.main:
            summary["merged_model"] = str(lora.export_merged(
                trainer.peft, trainer.processor, trainer.run_dir / "merged"))
        dist.destroy(trainer.dist)
    except torch.OutOfMemoryError as e:
        raise RuntimeError(
            f"out of memory at step {trainer.step + 1}: lower train.micro_batch_size (rows per "
            f"forward), set model.gradient_checkpointing=true, lower rollout.num_generations or "
            f"rollout.max_new_tokens, or reduce data.image_max_pixels. Resume with "
            f"train.resume=auto; the last checkpoint is intact.") from e
    finally:
        trainer.engine.close()
        log.close()
    if trainer.dist.main:
        (trainer.run_dir / "summary.json").write_text(
            json.dumps(json_safe(summary), indent=2, allow_nan=False))
        _print_table(trainer, summary)
    return summary


def _rl_step(trainer: Trainer) -> None:
    tc = trainer.cfg.train
    metrics = trainer.train_step()
    if tc.eval_every and trainer.eval_set and trainer.step % tc.eval_every == 0:
        res = _eval(trainer, f"step_{trainer.step:06d}")
        metrics.update({f"eval/{k}": v for k, v in res.items() if k != "n"})
    trainer.log.log(trainer.step, metrics, total=tc.steps)
    if trainer.nonfinite_streak >= max(1, tc.max_nonfinite_steps):
        raise FloatingPointError(
            f"step {trainer.step}: loss or gradient norm was NaN/inf in {trainer.nonfinite_streak} "
            f"steps in a row (each skipped, the weights untouched); lower train.lr, set "
            f"train.max_grad_norm (e.g. 1.0), use model.dtype=float32 or bfloat16 instead of "
            f"float16, or check the rewards' scale. Resume from the last checkpoint with "
            f"train.resume=auto")
    if tc.save_every and trainer.step % tc.save_every == 0 and trainer.step < tc.steps:
        trainer.save()


def _all_ranks(trainer: Trainer, flag: bool) -> bool:
    """True on every rank when any rank was asked to stop (they must save together)."""
    return bool(dist.all_sum(float(flag), trainer.dist) > 0) if trainer.dist.enabled else flag


def _print_table(trainer: Trainer, summary: dict) -> None:
    rows = [(k, f"{summary[k]:.3f}") for k in ("accuracy_before_rl", "accuracy_after_rl",
                                                "accuracy_shuffled_images", "chance")
            if isinstance(summary.get(k), (int, float))]
    rows.append(("steps", str(summary.get("steps"))))
    rows.append(("wall time", f"{summary.get('wall_seconds', 0.0) / 60:.1f} min"))
    rows.append(("run dir", str(trainer.run_dir)))
    trainer.log.mode = "lines" if trainer.log.mode == "off" else trainer.log.mode
    trainer.log.summary_table("mmrl run summary", rows)
