"""The stop signals, in this process with real signals: SIGTERM and SIGHUP ask for a stop as
Ctrl-C does, a second Ctrl-C aborts, a repeated SIGTERM changes nothing, an evaluation stops at
once, a rollout is abandoned once train.stop_timeout has passed; exit codes are 128 + signal. The
printed resume command is shell-quoted."""
from __future__ import annotations

import os
import shlex
import signal
import sys
import time

import pytest

from mmrl import config
from mmrl.train.run import resume_command
from mmrl.train.signals import StepAbandoned, StopNow, StopSignals


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs in the main thread between bytecodes


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                          (signal.SIGINT, 130)])
def test_each_stop_signal_asks_for_a_stop(signum, code):
    lines = []
    with StopSignals(30.0, say=lines.append) as stop:
        _send(signum)
        assert stop.requested and stop.exit_code == code
        _send(signal.SIGTERM)  # a repeat of SIGTERM/SIGHUP (or after Ctrl-C) changes nothing
    assert len(lines) == 1 and lines[0].startswith(f"\n{signal.Signals(signum).name}: finishing "
                                                   f"this step")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored on exit


def test_a_second_ctrl_c_aborts():
    with StopSignals(30.0, say=lambda line: None) as stop:
        _send(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGINT)
    assert stop.requested


def test_an_evaluation_stops_at_once():
    with StopSignals(30.0, say=lambda line: None) as stop:
        with pytest.raises(StopNow), stop.interruptible():
            _send(signal.SIGTERM)
            pytest.fail("the evaluation went on")
        with pytest.raises(StopNow), stop.interruptible():  # entering one after the signal
            pass


def test_a_rollout_is_abandoned_after_the_timeout_not_before():
    with StopSignals(0.3, say=lambda line: None) as stop:
        started = time.monotonic()
        with pytest.raises(StepAbandoned), stop.abandonable():
            _send(signal.SIGTERM)
            while time.monotonic() - started < 5:
                time.sleep(0.01)
        assert 0.3 <= time.monotonic() - started < 2
    with StopSignals(0.2, can_abandon=False, say=lambda line: None) as stop:  # several ranks
        with stop.abandonable():
            _send(signal.SIGTERM)
            time.sleep(0.5)  # the step finishes
        assert stop.requested


def test_resume_command_is_shell_quoted(monkeypatch):
    cfg = config.load(None, ["data.train=x.jsonl", "log.run_dir=/runs/my run"])
    monkeypatch.setattr(sys, "argv", ["mmrl", "train", "my recipe.yaml", "train.resume=none"])
    cmd = resume_command(cfg)
    assert shlex.split(cmd) == ["mmrl", "train", "my recipe.yaml", "log.run_dir=/runs/my run",
                                "train.resume=auto"]
