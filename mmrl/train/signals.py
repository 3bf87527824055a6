"""Stopping a run on a signal: SIGINT (Ctrl-C), SIGTERM (SLURM at preemption and at the time
limit, `docker stop`, `kill`) and SIGHUP (a closed terminal) all ask the run to stop, save and
print the command that resumes it, exiting 128 + the signal's number (130, 143, 129).

What happens depends on where the run is when the signal comes (run.py):
- an RL step finishes, then the run saves. A single-process step still in its rollout after
  `train.stop_timeout` seconds is abandoned instead: the run rewinds to the state at the step's
  start (the previous step's end) and saves that, so the step is redone after the resume exactly
  as the uninterrupted run did it. A multi-process step always finishes (the ranks must stop at
  the same point of their collectives);
- an evaluation (single process) stops at once: the checkpoint of the steps done so far is saved
  and the evaluation runs again on resume;
- the SFT warm-up stops after its current step; it has no checkpoint, so nothing is saved and it
  starts over on resume (the message says so).
A second Ctrl-C aborts at once without saving; a repeated SIGTERM or SIGHUP changes nothing.
"""
from __future__ import annotations

import _thread
import signal
import sys
import threading
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# BaseException, as KeyboardInterrupt: raised from a signal handler into any code, they must
# pass through its `except Exception` (a reward's, a decoder's) to the run that stops.
class StopNow(BaseException):
    """Raised by the handler inside `interruptible()` (an evaluation)."""


class StepAbandoned(BaseException):
    """Raised inside `abandonable()` (a rollout) once the grace after a signal has run out."""


class StopSignals:
    """Inside `with`: the stop signals set `signum` instead of killing the process."""

    def __init__(self, timeout: float, can_abandon: bool = True, say=None):
        self.timeout, self.can_abandon, self.signum = timeout, can_abandon, None
        self.say = say or _stderr
        self._old: dict = {}
        self._interruptible = self._abandonable = self._expired = self._from_timer = False
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self.handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for s, old in self._old.items():
            signal.signal(s, old)

    def handle(self, signum, frame) -> None:
        if self._from_timer:  # the grace ran out inside a rollout (`_expire`)
            self._from_timer = False
            if self._abandonable:
                raise StepAbandoned
            return
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: abort, nothing saved
            return
        self.signum = signum
        grace = (f" (or abandoning it after train.stop_timeout={self.timeout:g} s)"
                 if self.can_abandon else "")
        self.say(f"\n{self.name}: finishing this step{grace}, then saving a checkpoint"
                 + (" (Ctrl-C again to abort without saving)" if signum == signal.SIGINT else ""))
        self._timer = threading.Timer(self.timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()
        if self._interruptible:
            raise StopNow

    def _expire(self) -> None:
        if not self.can_abandon:
            return
        self._expired = True
        if self._abandonable:
            self._from_timer = True
            _thread.interrupt_main(self.signum)  # runs `handle` in the main thread

    @contextmanager
    def interruptible(self, enabled: bool = True):
        """Inside: a stop signal raises StopNow at once (work that can simply be redone)."""
        if self.requested and enabled:
            raise StopNow
        self._interruptible = enabled
        try:
            yield
        finally:
            self._interruptible = False

    @contextmanager
    def abandonable(self, enabled: bool = True):
        """Inside: once `timeout` seconds have passed since the signal, StepAbandoned is
        raised (at once on entry when they have)."""
        if self._expired and enabled:
            raise StepAbandoned
        self._abandonable = enabled
        try:
            yield
        finally:
            self._abandonable = False


def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # SIGHUP: the terminal may be gone
        pass
