"""The configured tools of a run, and running a turn's calls: concurrently across trajectories,
each within a time limit, every failure an error outcome of its own kind.

Calls run on daemon threads, at most `workers` at a time. A call past its time limit is
answered "timeout" and abandoned (Python cannot stop a thread): its thread finishes in the
background and never blocks the run or its exit, but keeps its CPU while it runs, so a tool that
can hang should bound its own work too.
"""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mmrl.tools import builtin  # noqa: F401  (registers crop, frames, audio_clip in TOOLS)
from mmrl.tools.base import (TOOLS, ToolContext, ToolInputError, as_items, model_parameters,
                             spec_of, watching)
from mmrl.tools.calls import ToolCall
from mmrl.types import ToolCallRecord


@dataclass(frozen=True)
class Tool:
    name: str  # what the model calls it
    fn: Callable
    spec: dict  # {"name", "description", "parameters"}
    params: dict  # settings bound as keywords (tools.use[].params)
    takes_context: bool


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


def load_tool(name: str, params: dict | None = None, where: str = "tools.use") -> Tool:
    """A built-in tool by name, or a user function "pkg.mod:fn" (called by its own name). The
    settings in `params` must be keyword-only parameters of the function (ValueError naming
    `where` otherwise): what the model may set and what the run fixes stay apart."""
    try:
        fn = TOOLS.get(name)
    except KeyError as e:
        raise ValueError(f"{where}: {e.args[0]}; built-in: {', '.join(TOOLS.names())}") from None
    if not callable(fn):
        raise ValueError(f"{where}: {name!r} is not a function")
    signature = inspect.signature(fn)
    settings = {p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY}
    unknown = sorted(set(params or {}) - settings)
    if unknown:
        raise ValueError(f"{where}: {name} has no setting {unknown} (its keyword-only parameters: "
                         f"{sorted(settings) or 'none'})")
    tool_name = name if name in TOOLS else fn.__name__
    return Tool(name=tool_name, fn=fn, spec=spec_of(fn, tool_name), params=dict(params or {}),
                takes_context="context" in signature.parameters)


class Toolbox:
    """The tools a run offers, by the name the model calls them."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 30.0, workers: int = 8,
                 instructions: str | None = None):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"tools.use: two tools are called {t.name!r}")
            self.tools[t.name] = t
        self.timeout_s, self.workers = float(timeout_s), max(1, int(workers))
        self.instructions = instructions  # tools.instructions: None = the call format's own

    @classmethod
    def from_config(cls, tc) -> "Toolbox":
        """From a ToolsConfig (tools.use, timeout_s, workers, instructions)."""
        tools = [load_tool(spec.name, spec.params, f"tools.use[{i}]")
                 for i, spec in enumerate(tc.use)]
        return cls(tools, tc.timeout_s, tc.workers, tc.instructions)

    def offered(self, sample) -> list[str]:
        """The tools `sample` may call: its record's "tools" field, else every configured tool.
        A record naming a tool the run does not configure is a ValueError naming the record."""
        named = sample.fields.get("tools")
        if named is None:
            return list(self.tools)
        if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
            raise ValueError(f"{sample.source}: 'tools' must be a list of tool names, got {named!r:.80}")
        missing = [n for n in named if n not in self.tools]
        if missing:
            raise ValueError(f"{sample.source}: the record offers tools {missing} that the run does "
                             f"not configure (tools.use has: {', '.join(self.tools) or 'none'})")
        return named

    def context(self, prompt, processor, coords: str = "resized") -> ToolContext:
        """The tools' view of one prompt (shared by its G trajectories): the frames its images
        reached the model in, read from the processor's grids (patch size x grid), the budgets
        of the processor, the family's box convention (`coords`: its adapter's box_coords), and
        the originals: a record's full_images / full_videos / full_audios when it has them,
        else its own media."""
        ip = getattr(processor, "image_processor", None)
        patch = int(getattr(ip, "patch_size", 14) or 14)
        factor = patch * int(getattr(ip, "merge_size", 2) or 2)
        grids = prompt.tensors.get("image_grid_thw")
        sizes = [] if grids is None else [(int(w) * patch, int(h) * patch)
                                          for _, h, w in grids.tolist()]
        s = prompt.sample
        size = getattr(ip, "size", None)
        budget = (28 * 28 * 4, 28 * 28 * 256)
        if size is not None and size.get("shortest_edge") and size.get("longest_edge"):
            budget = (int(size["shortest_edge"]), int(size["longest_edge"]))
        return ToolContext(prompt=prompt, input_sizes=sizes,
                           images=s.fields.get("full_images") or list(s.images),
                           videos=s.fields.get("full_videos") or list(s.videos),
                           audios=s.fields.get("full_audios") or list(s.audios),
                           factor=factor, coords=coords, image_pixels=budget)

    def specs(self, names: Sequence[str]) -> list[dict]:
        """Function specs in the OpenAI/Qwen form chat templates take as `tools`."""
        return [{"type": "function", "function": self.tools[n].spec} for n in names]

    # ------------------------------------------------------------------------ running ------

    def run(self, jobs: Sequence[tuple[ToolCall, ToolContext, Sequence[str]]]) -> list[Outcome]:
        """Answer every (call, context, offered tool names) in order; calls that can run do so
        concurrently, each within `timeout_s`."""
        out: list[Outcome | None] = [None] * len(jobs)
        runnable = []
        for i, (call, context, offered) in enumerate(jobs):
            problem = self._check(call, offered)
            if problem is not None:
                out[i] = problem
            else:
                runnable.append((i, self.tools[call.name], call, context))
        for start in range(0, len(runnable), self.workers):
            for i, outcome in self._wave(runnable[start:start + self.workers]):
                out[i] = outcome
        return out  # type: ignore[return-value]

    def _check(self, call: ToolCall, offered: Sequence[str]) -> Outcome | None:
        if call.error is not None:
            return Outcome(error=call.error, message=call.detail)
        if call.name not in offered:
            return Outcome(error="unknown_tool", message=f"no tool {call.name!r}; available: "
                           f"{', '.join(offered) or 'none'}")
        tool = self.tools[call.name]
        allowed = {p.name for p in model_parameters(tool.fn)}
        try:
            if set(call.arguments) - allowed:
                raise TypeError(f"unexpected argument(s) {sorted(set(call.arguments) - allowed)}")
            inspect.signature(tool.fn).bind(
                **({"context": None} if tool.takes_context else {}), **call.arguments)
        except TypeError as e:
            return Outcome(error="bad_arguments", message=f"{call.name}: {e}; parameters: "
                           f"{', '.join(sorted(allowed)) or 'none'}")
        return None

    def _wave(self, batch: list[tuple[int, Tool, ToolCall, ToolContext]]):
        results: dict[int, Outcome] = {}
        threads = []
        for i, tool, call, context in batch:
            thread = threading.Thread(target=_call, args=(tool, call, context, results, i),
                                      name=f"mmrl-tool-{tool.name}", daemon=True)
            thread.start()
            threads.append((i, thread, time.monotonic() + self.timeout_s))
        for i, thread, deadline in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            outcome = results.get(i)
            if thread.is_alive() or outcome is None:
                outcome = Outcome(error="timeout", message=f"no result within {self.timeout_s:g} s",
                                  seconds=self.timeout_s)
            yield i, outcome


def _call(tool: Tool, call: ToolCall, context: ToolContext, results: dict, i: int) -> None:
    """Runs on a tool thread: the outcome of one call, never an exception."""
    start = time.monotonic()
    kwargs: dict[str, Any] = {**call.arguments, **tool.params}
    if tool.takes_context:
        kwargs["context"] = context
    seen = watching()
    try:
        value = tool.fn(**kwargs)
        try:
            outcome = Outcome(items=as_items(value), seen=seen)
        except TypeError as e:  # something the model cannot be shown
            outcome = Outcome(error="bad_result", message=f"{tool.name}: {e}")
    except ToolInputError as e:
        outcome = Outcome(error=e.kind, message=str(e))
    except Exception as e:  # a tool's own failure: the model is told, the run goes on
        outcome = Outcome(error="exception", message=f"{type(e).__name__}: {str(e)[:300]}")
    outcome.seconds = time.monotonic() - start
    results[i] = outcome
