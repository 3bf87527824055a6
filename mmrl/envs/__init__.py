"""Environments: what a trajectory interacts with between model turns (base.py: the contract)."""
from mmrl.envs import grid_nav  # noqa: F401  (registers "grid_nav")
from mmrl.envs.base import ENVIRONMENTS, Environment, Step

__all__ = ["ENVIRONMENTS", "Environment", "Step"]
