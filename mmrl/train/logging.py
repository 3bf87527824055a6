"""Where metrics go: metrics.jsonl (always), TensorBoard, wandb (opt-in, offline by default),
rollouts.jsonl, and the live display (rich bar on a TTY, plain lines in logs)."""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from mmrl import config_rules

# Shown on the live line, in this order, when present.
HEADLINE = [("reward/total_mean", "reward"), ("eval/accuracy", "acc"),
            ("completion/length_mean", "len"), ("time/step", "s/step")]


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps the file parseable by every tool
    return v


def json_safe(value: Any) -> Any:
    """`value` with every NaN/inf (nested in dicts and lists) replaced by None."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return _jsonable(value)


def _last_step(path: Path) -> int | None:
    """The last step a metrics file holds (0 when empty), None when there is no file."""
    if not path.is_file():
        return None
    last = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            last = max(last, int(json.loads(line).get("step", 0)))
        except (ValueError, TypeError, AttributeError):
            continue
    return last


# Per progress mode: (live bar, a line every log_every steps, messages and tables). "off" hides
# the bar and step lines only; "silent" (non-main ranks) hides everything.
PROGRESS_SHOWS = {"bar": (True, False, True), "lines": (False, True, True),
                  "off": (False, False, True), "silent": (False, False, False)}


@contextmanager
def _writing(path: Path):
    """An OSError raised inside names `path`: a full disk's error carries no file name, and
    the one-line error (cli.py, checkpoint.write_failure) names the file and its folder's free
    space from it."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(Path(path).absolute())) from None


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes events in a thread that dies printing its traceback on a full disk,
    then re-raises the error at the next `add_scalar`: that second raise is the one reported
    (named by `_writing`), so the thread's own traceback is not printed."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "mmrl_quiet_tensorboard", False):
        return

    def hook(args):
        if not (isinstance(args.thread, _AsyncWriterThread) and
                issubclass(args.exc_type, OSError)):
            previous(args)

    hook.mmrl_quiet_tensorboard = True
    threading.excepthook = hook


class RunLogger:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True, wandb: bool = False,
                 progress: str = "auto", log_every: int = 10, config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = Console(stderr=True)
        resumed_at = _last_step(self.run_dir / "metrics.jsonl")
        self._metrics = (self.run_dir / "metrics.jsonl").open("a")
        self._rollouts = (self.run_dir / "rollouts.jsonl").open("a")
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # A resumed run (its metrics.jsonl already cut back to the checkpoint) hides the
            # events the interrupted run wrote past that step, so each step shows once.
            purge = None if resumed_at is None else resumed_at + 1
            _quiet_tensorboard_thread()
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge)
        if wandb:
            self._wandb = _start_wandb(self.run_dir, config)
        mode = config_rules.resolve_progress(progress, tty=sys.stderr.isatty())
        self.shows_bar, self.shows_lines, self.shows_messages = PROGRESS_SHOWS[mode]
        self.log_every = max(1, log_every)
        self._progress: Progress | None = None
        self._task = None
        self.history: list[dict] = []
        self._hf_bars = _hf_progress_bars(False)

    # -- live display -------------------------------------------------------------------------
    def start(self, total: int, done: int = 0, description: str = "RL") -> None:
        if not self.shows_bar:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"), console=self.console, transient=False)
        self._progress.start()
        self._task = self._progress.add_task(description, total=total, completed=done, info="")

    def advance(self, step: int, total: int | None, info: str, label: str = "step",
                keep: bool = False) -> None:
        """Move the live bar to `step` with `info` beside it; in lines mode print `label
        step/total  info` every log_every steps, and at the first and the last. A `keep` step
        (a check's result) is printed in every mode that shows messages, above a live bar."""
        line = f"{label} {step}/{total or '?'}  {info}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
            if keep:
                self._say(line)
        elif (self.shows_lines and (step % self.log_every == 0 or step in (1, total))
              or keep and self.shows_messages):
            self._say(line)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def print(self, msg: str) -> None:
        if self.shows_messages:
            self._say(msg)

    def warn(self, msg: str) -> None:
        """A warning shown above the progress bar (or in the log lines), also in warnings.txt."""
        with _writing(self.run_dir / "warnings.txt"), \
                (self.run_dir / "warnings.txt").open("a") as f:
            f.write(msg + "\n")
        self._say(Text.assemble(("warning: ", "bold yellow"), msg))

    def _say(self, text: str | Text) -> None:
        """One message as written: no rich markup read in it (a path or a key may hold
        brackets) and no wrap at the console's width (a file:line cut in two cannot be
        searched for or clicked)."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _headline(self, metrics: dict) -> str:
        parts = [f"{short} {metrics[k]:.3g}" for k, short in HEADLINE
                 if isinstance(metrics.get(k), (int, float))]
        return "  ".join(parts)

    # -- records ------------------------------------------------------------------------------
    def log(self, step: int, metrics: dict[str, Any], total: int | None = None) -> None:
        row = {"step": step, "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        self.history.append(row)
        with _writing(self.run_dir / "metrics.jsonl"):
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        with _writing(self.run_dir / "tensorboard"):
            for k, v in row.items():
                if self._tb is not None and k not in ("step", "time") and \
                        isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if v is not None}, step=step)
        self.advance(step, total, self._headline(row))

    def log_rollouts(self, step: int, rows: list[dict]) -> None:
        with _writing(self.run_dir / "rollouts.jsonl"):
            for r in rows:
                self._rollouts.write(json.dumps({"step": step, **{
                    k: _jsonable(v) if not isinstance(v, (list, dict, str)) else v
                    for k, v in r.items()}}) + "\n")
            self._rollouts.flush()

    def summary_table(self, title: str, rows: list[tuple[str, str]]) -> None:
        if not self.shows_messages:
            return
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in rows:
            table.add_row(k, v)
        self.console.print(table)

    def close(self) -> None:
        self.stop()
        _hf_progress_bars(self._hf_bars)
        self._metrics.close()
        self._rollouts.close()
        if self._tb is not None:
            with _writing(self.run_dir / "tensorboard"):
                self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _hf_progress_bars(enabled: bool) -> bool:
    """Turn transformers' own progress bars on or off -> whether they were on. While a run logs,
    the display is the RunLogger's: "Writing model shards" at every checkpoint tore the live bar
    and filled logs with carriage-return lines."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    return was


def _start_wandb(run_dir: Path, config: dict | None):
    try:
        import wandb
    except ImportError:
        raise RuntimeError("log.wandb=true but wandb is not installed: pip install 'mmrl[wandb]' "
                           "(or set log.wandb=false; metrics.jsonl and TensorBoard are always on)")
    os.environ.setdefault("WANDB_MODE", "offline")  # no account or network needed by default
    return wandb.init(project="mmrl", dir=str(run_dir), config=config or {},
                      name=run_dir.name)
