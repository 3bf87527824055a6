"""The rollout part: G completions per prompt from the configured engine, as a RolloutBatch.

It asks the engine what it is (`samples_from_training_model`) instead of its type: an engine that
samples with the training model needs the weights whole while it generates and never needs a
sync; one with its own copy (vLLM) needs the new weights after every update. Every rollout runs
through the trajectory loop (mmrl/rollout/trajectory.py) over that engine with the run's
environment: single-turn is its first generation as the engine returned it; with tools or a user
environment each of the G samples is a trajectory of model and observation turns.
"""
from __future__ import annotations

import torch

from typing import TYPE_CHECKING

from mmrl.config import RunConfig
from mmrl.rollout import make_engine
from mmrl.rollout.environments import make_environments
from mmrl.rollout.trajectory import TrajectoryRollout
from mmrl.train import sp, speed
from mmrl.types import PromptFeatures, RolloutBatch, SamplingParams

if TYPE_CHECKING:
    from mmrl.train.policy import Policy


class Rollout:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("generate", "sync", "close", "metrics")

    def __init__(self, cfg: RunConfig, policy: Policy, envs=None, model=None):
        """`envs`: the run's environment kind (built once per run, environments.py; None: built
        here). `model`: sample from this model instead of the policy's (the async sampler's own
        copy of the weights, mmrl/train/async_rollout.py)."""
        rc = cfg.rollout
        self.rc, self.policy = rc, policy
        self.model = policy.model if model is None else model
        self._weight_bytes = None  # of the weights a decode step reads (speed.py), once
        self.tokenizer = policy.codec.tokenizer
        with policy.full_params():  # a colocated engine starts from the whole weights
            self.engine = make_engine(rc, self.model, policy.codec)
        if envs is None:
            envs = make_environments(cfg, policy.codec)
        self.loop = TrajectoryRollout.for_run(cfg, self.engine, policy.codec, envs)
        if cfg.tools.enabled and policy.info.main:
            print(self.loop.style.reason, flush=True)  # tool role or <tool_response>

    @torch.no_grad()
    def generate(self, prompts: list[PromptFeatures], group_offset: int = 0) -> RolloutBatch:
        sequence = self.policy.sequence
        if sequence.size == 1:
            return self._generate(prompts, group_offset)
        # Sequence parallelism: each rank of the group samples its share of the prompts, then
        # the group swaps them, so every rank holds the same rows (train/sp.py says why).
        lo, hi = sp.share(len(prompts), sequence.rank, sequence.size)
        mine = self._generate(prompts[lo:hi], group_offset + lo)
        parts = sp.gather_objects((mine.completion_ids, mine.completion_mask, mine.sampler_logp,
                                   mine.truncated, mine.texts), sequence)
        pieces = []
        for rank, (ids, mask, slogp, truncated, texts) in enumerate(parts):
            a, b = sp.share(len(prompts), rank, sequence.size)
            pieces.append(self._batch(prompts[a:b], group_offset + a, ids, mask, slogp,
                                      truncated, texts))
        return RolloutBatch.cat(pieces, self.policy.codec.pad_id)

    def _generate(self, prompts: list[PromptFeatures], group_offset: int) -> RolloutBatch:
        rc, policy = self.rc, self.policy
        self.model.eval()
        # The training model's own generate under ZeRO-3 / FSDP2: the weights are gathered
        # once, not once per token.
        sampling = SamplingParams.from_rollout(rc, suppress_ids=policy.codec.placeholder_ids)
        with policy.full_params(self.engine.samples_from_training_model):
            return self.loop.rollout(prompts, sampling, group_offset)

    def _batch(self, prompts, group_offset, ids, mask, slogp, truncated, texts) -> RolloutBatch:
        g = self.rc.num_generations
        return RolloutBatch(
            prompts=[p for p in prompts for _ in range(g)], completion_ids=ids,
            completion_mask=mask, texts=texts, truncated=truncated, sampler_logp=slogp,
            group_ids=torch.arange(len(prompts)).repeat_interleave(g) + group_offset)

    def metrics(self, generated: int) -> dict:
        """The step's prefill and decode seconds, generated tokens/s (`generated` tokens) and
        the decode's bandwidth, from an engine that times itself (`take_timing`); else none."""
        take = getattr(self.engine, "take_timing", None)
        if take is None:
            return {}
        model = self.policy.model
        if self._weight_bytes is None:
            self._weight_bytes = speed.decode_weight_bytes(model)
        return speed.engine_metrics(take(), generated, self._weight_bytes,
                                    speed.copy_bandwidth(next(model.parameters()).device))

    def sync(self) -> None:
        """An engine with its own weights reloads the policy's (gathered whole first when
        sharded); one that samples with the training model already has them."""
        if self.engine.samples_from_training_model:
            return
        with self.policy.full_params():
            self.engine.sync_weights(self.policy.model)

    def close(self) -> None:
        self.engine.close()
