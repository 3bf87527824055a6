"""The checkpointer: what a run saves and restores so that a resumed run continues bit-for-bit.

Each part contributes its own state (`learner.state_dict()`, `prompts.state_dict()`); the file
layout and the atomic write are checkpoint.py's. (The KL reference, which must survive a resume
unchanged, is saved by the Policy itself: train/policy.py.)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmrl.config import TrainConfig
from mmrl.train import checkpoint, dist

if TYPE_CHECKING:
    from mmrl.train.learner import Learner
    from mmrl.train.logging import RunLogger
    from mmrl.train.prompts import PromptSource


class Checkpointer:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("save", "restore")

    def __init__(self, run_dir: Path, tc: TrainConfig, info: dist.DistInfo, log: RunLogger):
        self.run_dir, self.info, self.log = Path(run_dir), info, log
        self.tc = tc  # its run_id is set by rundir.prepare before the run starts

    def save(self, step: int, learner: Learner, prompts: PromptSource, extra: dict) -> None:
        """A collective: rank 0 writes the model and state, sharded strategies every rank's part
        (replicated weights are identical on every rank after the all-reduced step)."""
        state = {**learner.state_dict(), **prompts.state_dict(), "extra": extra,
                 "run_id": self.tc.run_id}
        policy = learner.policy
        checkpoint.save(self.run_dir, step, policy.to_save, policy.codec.processor, state,
                        keep=self.tc.keep_checkpoints, strategy=learner.strategy,
                        optimizer=learner.optimizer)

    def restore(self, ckpt: Path, learner: Learner, prompts: PromptSource) -> tuple[int, dict]:
        """Load every part's state and the RNG streams -> (step, extra state)."""
        state = checkpoint.load_state(ckpt, self.info.rank, self.info.world)
        learner.load_state_dict(state, ckpt)
        prompts.load_state_dict(state)
        checkpoint.set_rng_state(state["rng"])
        self.log.print(f"resumed from {ckpt} at step {state['step']}")
        return state["step"], state.get("extra", {})
