"""The configured tools of a run, and running a turn's calls: concurrently across trajectories,
each within a time limit, every failure an error outcome of its own kind.

User tools ("pkg.mod:fn") run in worker processes (mmrl/tools/workers.py), at most `workers` at
a time: a call past its time limit is answered "timeout" and its worker is killed, so the limit
holds even for code that holds the interpreter lock. The built-in tools, whose work is bounded
(one decode, one resize), run on daemon threads in the trainer, at most `workers` at a time; one
past its limit is answered "timeout" and abandoned.
"""
from __future__ import annotations

import inspect
import pickle
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from mmrl.tools import builtin  # noqa: F401  (registers crop, frames, audio_clip in TOOLS)
from mmrl.tools.base import TOOLS, ToolContext, model_parameters, spec_of
from mmrl.tools.calls import ToolCall
from mmrl.tools.outcome import Outcome, execute
from mmrl.tools.workers import WAKE_S, WorkerPool

if TYPE_CHECKING:  # a type only: tools import no model code
    from mmrl.models.codec import Codec


@dataclass(frozen=True)
class Tool:
    name: str  # what the model calls it
    fn: Callable
    spec: dict  # {"name", "description", "parameters"}
    params: dict  # settings bound as keywords (tools.use[].params)
    takes_context: bool
    in_process: bool = True  # a built-in (bounded work); user tools run in worker processes


def _max_frames(tool: Tool) -> int:
    """The frames `tool` is set to return at most: its `max_frames` setting, else the
    function's default for it; 0 when it has none."""
    if "max_frames" in tool.params:
        return int(tool.params["max_frames"])
    p = inspect.signature(tool.fn).parameters.get("max_frames")
    return int(p.default) if p is not None and isinstance(p.default, int) else 0


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
    builtin = name in TOOLS
    tool_name = name if builtin else fn.__name__
    if not builtin:  # it runs in a worker process, reached by its module and name
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise ValueError(f"{where}: {name} cannot run in a tool worker process (it must be a "
                             f"module-level function): {e}") from None
    return Tool(name=tool_name, fn=fn, spec=spec_of(fn, tool_name), params=dict(params or {}),
                takes_context="context" in signature.parameters, in_process=builtin)


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
        self.pool = WorkerPool(self.workers)  # user tools; its processes start at first use
        self.max_frames, self.max_audio_seconds = 64, None  # data.video_max_frames, ...

    @classmethod
    def from_config(cls, tc, data=None) -> "Toolbox":
        """From a ToolsConfig (tools.use, timeout_s, workers, instructions); a DataConfig
        `data` gives the results the records' frame and audio limits."""
        tools = [load_tool(spec.name, spec.params, f"tools.use[{i}]")
                 for i, spec in enumerate(tc.use)]
        box = cls(tools, tc.timeout_s, tc.workers, tc.instructions)
        if data is not None:
            # A tool set to return N frames (its `max_frames`, given or its default) may: a look
            # closer in time than the records' first look (video_search: 8 frames of a span
            # against a 4-frame overview) is what `frames` is for.
            box.max_frames = max([data.video_max_frames, *map(_max_frames, tools)])
            box.max_audio_seconds = data.audio_max_seconds
        return box

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

    def context(self, prompt, codec: Codec) -> ToolContext:
        """The tools' view of one prompt (shared by its G trajectories): the frames its images
        reached the model in, read from the processor's grids (patch size x grid), the codec's
        image factor, pixel budget and box convention, and the originals: a record's
        full_images / full_videos / full_audios when it has them, else its own media."""
        patch = codec.patch_size
        grids = prompt.tensors.get("image_grid_thw")
        sizes = [] if grids is None else [(int(w) * patch, int(h) * patch)
                                          for _, h, w in grids.tolist()]
        s = prompt.sample
        budget = codec.pixel_budget() or (28 * 28 * 4, 28 * 28 * 256)
        return ToolContext(prompt=prompt, input_sizes=sizes,
                           images=s.fields.get("full_images") or list(s.images),
                           videos=s.fields.get("full_videos") or list(s.videos),
                           audios=s.fields.get("full_audios") or list(s.audios),
                           factor=codec.image_factor, coords=codec.box_coords, image_pixels=budget,
                           max_frames=self.max_frames, max_audio_seconds=self.max_audio_seconds)

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
        remote = [(i, _message(tool, call, context)) for i, tool, call, context in runnable
                  if not tool.in_process]
        if remote:
            for i, outcome in self.pool.run(remote, self.timeout_s, self._timed_out).items():
                out[i] = outcome
        local = [job for job in runnable if job[1].in_process]
        for start in range(0, len(local), self.workers):
            for i, outcome in self._wave(local[start:start + self.workers]):
                out[i] = outcome
        return out  # type: ignore[return-value]

    def _timed_out(self) -> Outcome:
        return Outcome(error="timeout", message=f"no result within {self.timeout_s:g} s",
                       seconds=self.timeout_s)

    def _check(self, call: ToolCall, offered: Sequence[str]) -> Outcome | None:
        if call.error is not None:
            return Outcome(error=call.error, message=call.detail)
        if call.name not in offered:
            return Outcome(error="unknown_tool", message=f"no tool {call.name!r:.80}; available: "
                           f"{', '.join(offered) or 'none'}")
        tool = self.tools[call.name]
        allowed = {p.name for p in model_parameters(tool.fn)}
        try:
            if set(call.arguments) - allowed:
                extra = str(sorted(set(call.arguments) - allowed))
                raise TypeError(f"unexpected argument(s) {extra[:200]}")
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
            while thread.is_alive() and time.monotonic() < deadline:  # wakes for stop signals
                thread.join(min(WAKE_S, max(0.0, deadline - time.monotonic())))
            outcome = results.get(i)
            if thread.is_alive() or outcome is None:
                outcome = self._timed_out()
            yield i, outcome


def _message(tool: Tool, call: ToolCall, context: ToolContext) -> tuple:
    """What a worker process gets for one call: (fn, name, kwargs, context, limits)."""
    return (tool.fn, tool.name, {**call.arguments, **tool.params},
            context if tool.takes_context else None, context.limits)


def _call(tool: Tool, call: ToolCall, context: ToolContext, results: dict, i: int) -> None:
    """Runs on a tool thread: the outcome of one call, never an exception."""
    fn, name, kwargs, ctx, limits = _message(tool, call, context)
    results[i] = execute(fn, name, kwargs, ctx, limits)
