"""The interaction's part of the run configuration: the tools (`tools:`) and the environment
every trajectory talks to (`env:`). Re-exported by mmrl.config, where the rest of the
configuration lives."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from mmrl.config_options import CallFormat


@dataclass
class ToolSpec:
    name: str = MISSING  # crop | frames | audio_clip (`mmrl.tools.TOOLS`), or "pkg.mod:fn"
    params: dict[str, Any] = field(default_factory=dict)  # settings: the tool's keyword-only args


@dataclass
class ToolsConfig:
    """Multi-turn rollouts with tools (docs/tools.md). `use` empty: single-turn, as before."""

    use: list[ToolSpec] = field(default_factory=list)
    call_format: CallFormat = "qwen"
    # The system-message text that tells the model how to call (e.g. a paper's own tool prompt);
    # it replaces call_format's built-in instructions and a chat template's own `tools` block.
    # None: the built-in ones (docs/tools.md); "": none (no text, no `tools` block).
    instructions: Optional[str] = None
    max_turns: int = 3  # model turns per trajectory in training
    eval_max_turns: Optional[int] = None  # at evaluation (may be larger); None: max_turns
    # Completion tokens of a whole trajectory (model and observation turns); each model turn is
    # also capped by rollout.max_new_tokens. An observation that would not fit is dropped whole.
    max_tokens: int = 1024
    max_observation_tokens: int = 512  # one observation turn; longer: a too_long error instead
    # Trajectories that hit max_turns still calling tools leave the loss (Mini-o3's over-turn
    # masking) instead of training as failures.
    mask_truncated_trajectories: bool = False
    timeout_s: float = 30.0  # per tool call; past it the model reads a timeout error
    workers: int = 8  # tool calls running at once

    @property
    def enabled(self) -> bool:
        return bool(self.use)


@dataclass
class EnvConfig:
    """The environment every trajectory talks to between its model turns (docs/environments.md):
    one instance per trajectory, built from `name` and `args`. The budgets below are a user
    environment's; the tools environment keeps tools.*."""

    # auto: the tools environment when tools.use is set, else single_turn; or a registered name
    # (`mmrl.envs.ENVIRONMENTS`), or a user class "pkg.mod:Class".
    name: str = "auto"
    args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of its constructor
    max_turns: int = 4  # model turns per trajectory in training
    eval_max_turns: Optional[int] = None  # at evaluation (may be larger); None: max_turns
    max_tokens: int = 1024  # completion tokens of a trajectory: model and observation turns
    max_observation_tokens: int = 512  # one observation; a longer one ends the trajectory
    # Per step() call; past it the trajectory ends (info env_timeout: true). Python cannot kill
    # a thread: the late step finishes in the background and its result is dropped.
    timeout_s: float = 30.0
    workers: int = 8  # step() calls running at once (threads)

    def resolved(self, tools: bool) -> str:
        """The environment's name with "auto" resolved (`tools`: tools.use is set)."""
        if self.name == "auto":
            return "tools" if tools else "single_turn"
        return self.name
