"""The checkpointer: what a run saves and restores so that a resumed run continues bit-for-bit,
and the KL reference that must survive a resume unchanged.

Each part contributes its own state (`learner.state_dict()`, `prompts.state_dict()`); the file
layout and the atomic write are checkpoint.py's.
"""
from __future__ import annotations

from pathlib import Path

import torch

from mmrl.config import TrainConfig
from mmrl.train import checkpoint, dist, setup


class Checkpointer:
    def __init__(self, run_dir: Path, tc: TrainConfig, info: dist.DistInfo, log):
        self.run_dir, self.info, self.log = Path(run_dir), info, log
        self.tc = tc  # its run_id is set by rundir.prepare before the run starts

    def save(self, step: int, learner, prompts, extra: dict) -> None:
        """A collective: rank 0 writes the model and state, sharded strategies every rank's part
        (replicated weights are identical on every rank after the all-reduced step)."""
        state = {**learner.state_dict(), **prompts.state_dict(), "extra": extra,
                 "run_id": self.tc.run_id}
        checkpoint.save(self.run_dir, step, learner.peft or learner.model, learner.processor,
                        state, keep=self.tc.keep_checkpoints, strategy=learner.strategy,
                        optimizer=learner.optimizer)

    def restore(self, ckpt: Path, learner, prompts) -> tuple[int, dict]:
        """Load every part's state and the RNG streams -> (step, extra state)."""
        state = checkpoint.load_state(ckpt, self.info.rank, self.info.world)
        learner.load_state_dict(state, ckpt)
        prompts.load_state_dict(state)
        checkpoint.set_rng_state(state["rng"])
        self.log.print(f"resumed from {ckpt} at step {state['step']}")
        return state["step"], state.get("extra", {})

    def reference(self, learner, algo):
        """The KL reference: the policy as RL starts (after any SFT warm-up), or None when there
        is no KL term or LoRA serves it (adapter off). Saved once in the run dir so that a
        resumed run keeps the same reference, not the resumed policy."""
        model, strategy, processor = learner.model, learner.strategy, learner.processor
        if algo.ref_reset_every and (learner.peft is not None or strategy.shards_params):
            raise ValueError("algo.ref_reset_every: resetting the reference needs full fine-tuning "
                             "without ZeRO-3/FSDP2 parameter sharding")
        if not algo.uses_reference or learner.ref_model is not None or learner.peft is not None:
            return learner.ref_model
        path = self.run_dir / "reference"
        if not path.is_dir() and strategy.shards_params:  # no whole copy in memory
            weights = strategy.full_state_dict(model)
            if self.info.main:
                model.save_pretrained(path, state_dict=weights)
                checkpoint.hf_config(model).save_pretrained(path)
                processor.save_pretrained(path)
            dist.barrier(self.info)
        if path.is_dir():
            ref, _ = learner.adapter.load(str(path), dtype=next(model.parameters()).dtype)
            if not strategy.places_model:
                ref.to(learner.device)
            ref = strategy.frozen(setup.build_reference(ref, copy=False))
            if learner.touch_towers is not None and strategy.shards_params:
                learner.touch_towers.attach(ref)  # its forwards gather too
            return ref
        ref = setup.build_reference(model)
        if self.info.main:  # with the processor, so adapter.load can read it back
            ref.save_pretrained(path)
            processor.save_pretrained(path)
        return ref

    def reset_reference(self, learner) -> None:
        """ProRL: the KL reference becomes a copy of the current policy (saved, so a resumed run
        keeps it). Only where both are whole modules in this process (checked in `reference`)."""
        if learner.ref_model is None:
            return
        with torch.no_grad():
            learner.ref_model.load_state_dict(learner.model.state_dict())
        if self.info.main:
            learner.ref_model.save_pretrained(self.run_dir / "reference")
        dist.barrier(self.info)
