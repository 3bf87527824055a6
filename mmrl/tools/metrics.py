"""Per-step metrics over a batch's trajectories: the turns of every multi-turn environment
(`turns/*`) and, with tools, their calls (`tools/*`) in metrics.jsonl."""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from mmrl.tools.base import ERROR_KINDS
from mmrl.types import Trajectory

NAMELESS = ("malformed", "unknown_tool")  # errors whose call names no configured tool


def trajectory_metrics(trajectories: Sequence[Trajectory], tools: bool = True) -> dict[str, float]:
    """Means over trajectories: turns, observation tokens and the share that hit the turn cap
    (`turns/*`, every multi-turn environment); with `tools`, the calls (`tools/*`): calls per
    trajectory, the share that called a tool at all, per tool its calls per trajectory, the
    error rate (failed calls / calls) and each error kind's count per trajectory.

    >>> from mmrl.types import ToolCallRecord
    >>> calls = [ToolCallRecord("crop", {}, 0), ToolCallRecord("", {}, 1, error="malformed")]
    >>> m = trajectory_metrics([Trajectory(turns=3, calls=calls), Trajectory(turns=1)])
    >>> m["turns/mean"], m["tools/called_frac"], m["tools/error_rate"], m["tools/calls/crop"]
    (2.0, 0.5, 0.5, 0.5)
    >>> sorted(trajectory_metrics([Trajectory(turns=2)], tools=False))
    ['turns/cap_frac', 'turns/mean', 'turns/observation_tokens_mean']
    """
    n = max(1, len(trajectories))
    out = {"turns/mean": sum(t.turns for t in trajectories) / n,
           "turns/cap_frac": sum(t.hit_turn_cap for t in trajectories) / n,
           "turns/observation_tokens_mean": sum(t.observation_tokens for t in trajectories) / n}
    if not tools:
        return out
    calls = [c for t in trajectories for c in t.calls]
    # Per tool: the calls that named one (a name the model made up is its own text, no metric).
    per_tool = Counter(c.name for c in calls if c.name and c.error not in NAMELESS)
    errors = Counter(c.error for c in calls if c.error)
    out.update({
        "tools/calls_mean": len(calls) / n,
        "tools/called_frac": sum(bool(t.calls) for t in trajectories) / n,
        "tools/error_rate": sum(errors.values()) / len(calls) if calls else 0.0,
    })
    out.update({f"tools/calls/{name}": count / n for name, count in sorted(per_tool.items())})
    out.update({f"tools/errors/{kind}": errors.get(kind, 0) / n for kind in ERROR_KINDS})
    return out


def call_fields(trajectories: Sequence[Trajectory]) -> list[list[dict]]:
    """Each row's calls as plain dicts ({"name", "turn", "error", "seen"}): the `calls` field
    rewards get (tool_use, looked_at), since `rewards/` knows no mmrl type."""
    return [[{"name": c.name, "turn": c.turn, "error": c.error, "seen": c.seen} for c in t.calls]
            for t in trajectories]
