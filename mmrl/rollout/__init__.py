"""Rollout engines: `make_engine(cfg.rollout, model, codec)` -> RolloutEngine.

hf: the training model's own generate (mmrl.models.forward.generate). vllm: a colocated vLLM
engine (mmrl.rollout.vllm, imported only when chosen) or a `vllm serve` client. With tools,
`TrajectoryRollout` (mmrl.rollout.trajectory) runs multi-turn trajectories over any of them.
"""
from mmrl.rollout.base import RolloutEngine, make_engine

__all__ = ["RolloutEngine", "make_engine"]
