"""One call's outcome, and running one call (on a tool thread or in a worker process): every
failure an outcome of its kind, never an exception; results through the records' media guards."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from mmrl.tools.base import MediaLimits, ToolContext, ToolInputError, as_items, watching
from mmrl.tools.calls import ToolCall
from mmrl.types import ToolCallRecord

MESSAGE_CHARS = 600  # an error message the model reads: a tool's own text is clipped to this


@dataclass
class Outcome:
    """One call's answer: result items, or an error kind and the message the model reads."""

    items: list | None = None
    error: str | None = None
    message: str = ""
    seconds: float = 0.0
    seen: list[dict] | None = None  # what of the original media the tool read (looked_at)

    def record(self, call: ToolCall, turn: int) -> ToolCallRecord:
        """The trajectory's record of `call` (made at model turn `turn`) and this answer."""
        return ToolCallRecord(name=call.name, arguments=call.arguments, turn=turn,
                              error=self.error, seconds=self.seconds, message=self.message,
                              seen=list(self.seen or []) if self.error is None else [])


def execute(fn: Callable, name: str, kwargs: dict, context: ToolContext | None,
            limits: MediaLimits) -> Outcome:
    """One call on this thread or worker process: its outcome, never an exception. Results pass
    the records' media guards (`limits`); a message the model reads is clipped."""
    start = time.monotonic()
    if context is not None:
        kwargs = {**kwargs, "context": context}
    seen = watching()
    try:
        value = fn(**kwargs)
        try:
            outcome = Outcome(items=as_items(value, limits), seen=seen)
        except TypeError as e:  # something the model cannot be shown
            outcome = Outcome(error="bad_result", message=f"{name}: {str(e)[:MESSAGE_CHARS]}")
    except ToolInputError as e:
        outcome = Outcome(error=e.kind, message=str(e)[:MESSAGE_CHARS])
    except Exception as e:  # a tool's own failure: the model is told, the run goes on
        outcome = Outcome(error="exception", message=f"{type(e).__name__}: {str(e)[:300]}")
    outcome.seconds = time.monotonic() - start
    return outcome
