"""The evaluation's part of the run configuration (`eval:`): the held-out evaluation and the
field benchmarks it runs (`eval.benchmarks`). Re-exported by mmrl.config, where the rest of the
configuration lives."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class BenchmarkSpec:
    """One field benchmark (docs/benchmarks-eval.md): `mmrl.benchmarks.BENCHMARKS` name, its
    local copy (None: $MMRL_BENCHMARKS_DIR/NAME or data/benchmarks/NAME; "fixture": a small
    copy in its layout, written in the run dir), run before RL, every `every` steps (0: only
    before and after) and after RL, on the first `limit` rows (None: all)."""

    name: str = MISSING  # refcoco, mmau, vstar, mathvista, ... (docs/benchmarks-eval.md)
    path: Optional[str] = None  # the local copy's root, or "fixture"
    every: int = 0  # also every N RL steps (0: before and after RL only)
    limit: Optional[int] = None  # the first N rows (None: all)
    family_coords: bool = False  # boxes in the model family's convention, not the task's own
    max_new_tokens: Optional[int] = None  # None: the task's own (its generation_kwargs)
    tools: bool = True  # false: without the run's tools.use (results as NAME_no_tools)

    @property
    def key(self) -> str:
        """Its results' name: NAME, or NAME_no_tools for the tool-less setting."""
        return self.name if self.tools else f"{self.name}_no_tools"


@dataclass
class EvalConfig:
    max_samples: Optional[int] = None  # evaluate on the first N eval records
    batch_size: int = 32  # prompts generated at once
    max_new_tokens: Optional[int] = None  # default: rollout.max_new_tokens
    metric_reward: str = "accuracy"  # reward whose mean is reported as `accuracy`
    num_samples: int = 1  # k draws per sample: 1 = greedy; > 1 = sampled, reports pass@k
    temperature: float = 1.0  # for num_samples > 1
    pass_threshold: float = 1.0  # a draw counts as correct when the metric reward >= this
    before_rl: bool = True  # evaluate before RL (after SFT) for summary.json
    shuffled_images: bool = False  # also evaluate with images shuffled across samples
    benchmarks: list[BenchmarkSpec] = field(default_factory=list)  # field benchmarks, as lmms-eval
