"""User tools run in worker processes, so that `tools.timeout_s` really stops them.

A thread cannot be stopped: a backtracking regex on the model's text holds the interpreter lock
and ignores any timeout (with timeout_s 3, one step took 57.8 s). A process can: each call runs
in a worker of this pool, and a call past its deadline has its worker killed (SIGKILL) and
replaced; the call is answered "timeout". Workers come from a fork server (a clean process that
has imported mmrl's tool code once, not a copy of the trainer with its model and threads), start
before any deadline counts, and serve calls one at a time; a worker that dies answers its call as
an "exception". Any exception in the waiting thread (the run's stop signal abandoning the step,
Ctrl-C) kills the workers still busy, so no call outlives its step.

The tool function travels by reference (its module and name, as pickle does), the call's
`ToolContext` without its prompt tensors; each worker keeps the contexts it saw (by their uid)
so `context.cached` still loads once per group in that worker.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from collections import OrderedDict, deque
from multiprocessing.connection import wait
from typing import Any

START_TIMEOUT_S = 120.0  # a worker's start (importing the tool's module): not the call's time
# The waiting thread wakes this often: a stop signal's handler (train.stop_timeout running out
# raises StepAbandoned through _thread.interrupt_main, which wakes no blocked call) runs then.
WAKE_S = 0.1
_KEEP_CONTEXTS = 64


def _context() -> mp.context.BaseContext:
    methods = mp.get_all_start_methods()
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["mmrl.tools.outcome"])
        return ctx
    return mp.get_context("spawn")


def _serve(conn) -> None:
    """A worker's loop: (fn, name, kwargs, context, limits) in, an Outcome out."""
    from mmrl.tools.outcome import Outcome, execute

    contexts: OrderedDict[str, Any] = OrderedDict()
    conn.send("ready")
    while True:
        try:
            fn, name, kwargs, context, limits = conn.recv()
        except EOFError:  # the trainer is gone
            return
        except Exception as e:  # the tool's module failed to import here, ...
            conn.send(Outcome(error="exception", message=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        if context is not None:  # the group's cache lives on across its calls in this worker
            context = contexts.setdefault(context.uid, context)
            contexts.move_to_end(context.uid)
            while len(contexts) > _KEEP_CONTEXTS:
                contexts.popitem(last=False)
        outcome = execute(fn, name, kwargs, context, limits)
        try:
            conn.send(outcome)
        except Exception as e:  # pickling the result failed
            conn.send(Outcome(error="bad_result", message=f"{name}: the result cannot leave the "
                              f"tool's worker process: {type(e).__name__}: {str(e)[:200]}"))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True,
                                   name="mmrl-tool-worker")
        self.process.start()
        child.close()
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError(f"a tool worker process did not start within {START_TIMEOUT_S:g} s")

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class WorkerPool:
    """At most `size` calls at once, each in a worker process, each stopped at its deadline."""

    def __init__(self, size: int):
        self.size = max(1, int(size))
        self._idle: list[_Worker] = []
        self._ctx = None

    def _take(self) -> _Worker:
        if self._idle:
            return self._idle.pop()
        self._ctx = self._ctx or _context()
        return _Worker(self._ctx)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().kill()

    def __del__(self) -> None:  # an evaluation's toolbox goes: its idle workers go with it
        try:
            self.close()
        except Exception:  # at interpreter exit the modules may be gone; daemons end anyway
            pass

    def run(self, jobs: list[tuple[int, Any]], timeout_s: float, timeout_outcome) -> dict:
        """{i: Outcome} for jobs (i, (fn, name, kwargs, context, limits)); a call still running
        `timeout_s` after it started gets `timeout_outcome()` and its worker is killed."""
        from mmrl.tools.outcome import Outcome

        queue, busy, out = deque(jobs), {}, {}
        try:
            while queue or busy:
                while queue and len(busy) < self.size:
                    i, message = queue.popleft()
                    worker = self._take()  # started before the deadline counts
                    try:
                        worker.conn.send(message)
                    except Exception as e:  # the function or its arguments cannot be sent
                        self._idle.append(worker)
                        out[i] = Outcome(error="exception", message=f"{message[1]}: cannot run in "
                                         f"a worker process: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    busy[worker.conn] = (worker, i, message[1], time.monotonic())
                first = min((start for *_, start in busy.values()), default=time.monotonic())
                left = first + timeout_s - time.monotonic()
                for conn in wait(list(busy), timeout=min(WAKE_S, max(0.0, left))):
                    worker, i, name, start = busy.pop(conn)
                    try:
                        out[i] = conn.recv()
                        self._idle.append(worker)
                    except (EOFError, OSError):
                        worker.kill()
                        out[i] = Outcome(error="exception", message=f"{name}: its worker process "
                                         f"died (exit code {worker.process.exitcode})")
                    out[i].seconds = time.monotonic() - start
                now = time.monotonic()
                for conn, (worker, i, _, start) in list(busy.items()):
                    if now >= start + timeout_s:  # stopped for real: the process is killed
                        del busy[conn]
                        worker.kill()
                        out[i] = timeout_outcome()
        finally:  # an exception here (a stop signal abandoning the step): no call outlives it
            for worker, *_ in busy.values():
                worker.kill()
        return out
