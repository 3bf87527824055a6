"""Tools a model calls inside a trajectory: call parsing, the built-ins (crop, frames,
audio_clip) on the original media, user tools ("pkg.mod:fn"), the concurrent runner with its
time limit and error kinds, the tool prompt, and per-step metrics. docs/tools.md is the contract.

Arrows: tools -> data (media decoding), types, registry, rewards (box conventions); rollout ->
tools. Nothing here knows a model or a processor beyond asking it to render a template.
"""
from mmrl.tools.base import (ERROR_KINDS, TOOLS, ToolContext, ToolInputError, as_content,
                             as_items, error_text, tool_spec)
from mmrl.tools.calls import CALL_FORMATS, ParsedTurn, ToolCall, parse_turn
from mmrl.tools.metrics import call_fields, trajectory_metrics
from mmrl.tools.prompt import add_tool_prompt, tool_prompt
from mmrl.tools.toolbox import Outcome, Tool, Toolbox, load_tool

__all__ = ["CALL_FORMATS", "call_fields", "ERROR_KINDS", "TOOLS", "Outcome", "ParsedTurn", "Tool", "ToolCall",
           "ToolContext", "ToolInputError", "Toolbox", "add_tool_prompt", "as_content", "as_items",
           "error_text", "load_tool", "parse_turn", "tool_prompt", "tool_spec",
           "trajectory_metrics"]
