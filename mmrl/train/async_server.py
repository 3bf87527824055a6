"""The async sampler over a running `vllm serve` (rollout.backend=vllm with rollout.vllm.server_url
and rollout.max_staleness >= 1; mmrl/train/async_rollout.py holds the contract, docs/async.md).

The server is already a process of its own (on its own GPUs, or CPU cores): the trainer keeps
updating while the server samples, and nothing here needs a second copy of the model. Instead
of the HF sampler process (async_worker.py), a `ServerWorker` in the trainer's process -- driven
by async_rollout's dispatcher thread, which waits on HTTP without the interpreter lock -- runs
the synchronous loop's `Rollout` over the server engine:

- **Weights by version.** After each update the trainer stages the weights in the server's
  format (`vllm_state_dict`: checkpoint names, LoRA merged), on the CPU, with the version, and
  keeps their fingerprint. Before a batch, if a newer version is staged, the worker pushes it to
  the server (the engine's `rollout.vllm.weight_transfer`) while the trainer goes on updating;
  never in the middle of a batch.
- **Version check.** The fingerprint a drawn batch is checked against is the one the server's
  workers computed from the tensors they received (`WeightSync.loaded_fingerprint`), not one the
  trainer computed from what it meant to send: a push that did not arrive whole cannot pass.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from mmrl.config import RunConfig
from mmrl.train.async_worker import fingerprint

if TYPE_CHECKING:
    from mmrl.models.base import ModelAdapter
    from mmrl.train.policy import Policy


class ServerWeights:
    """`WeightBox` for the server: the staged state is the whole model in the server's format
    (a new dict per version, swapped in under `lock`), and the fingerprints are of that state."""

    def __init__(self, adapter: ModelAdapter, keep: int):
        import threading

        self.adapter, self.keep, self.lock = adapter, keep, threading.Lock()
        self.state: dict[str, torch.Tensor] | None = None
        self.version: int | None = None
        self.fingerprints: dict[int, torch.Tensor] = {}
        self.shared = None  # the HF sampler process's shared version (unused here)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        from mmrl.rollout.vllm_weights import vllm_state_dict

        state = {k: v.detach().to("cpu", copy=True).contiguous()
                 for k, v in vllm_state_dict(model, self.adapter).items()}
        self.fingerprints[version] = fingerprint(state.values())
        with self.lock:
            self.state, self.version = state, version
        for old in [v for v in self.fingerprints if v < version - self.keep]:
            del self.fingerprints[old]

    def staged(self) -> tuple[dict[str, torch.Tensor], int]:
        with self.lock:
            return self.state, self.version

    def matches(self, version: int, fp: torch.Tensor) -> bool:
        expected = self.fingerprints.get(version)
        return (expected is not None and fp.shape == expected.shape
                and torch.allclose(fp, expected, rtol=1e-9, atol=1e-12))


class _ServerPolicy:
    """The few Policy members `Rollout` reads. The server holds the weights, so the local
    "model" is an empty module: the dispatcher thread never touches the trainer's model (not
    even its train/eval mode)."""

    def __init__(self, policy: Policy):
        self.model = torch.nn.Module()
        self.codec, self.sequence, self.info = policy.codec, policy.sequence, policy.info

    def full_params(self, enabled: bool = True):
        return nullcontext()


class ServerWorker:
    """What async_rollout's dispatcher calls: `draw(prompts, published)` -> (RolloutBatch,
    version of the weights the server held, the server's fingerprint of them)."""

    def __init__(self, cfg: RunConfig, policy: Policy, weights: ServerWeights, envs=None):
        """`envs`: the run's environment kind (built once per run; None: built here)."""
        from mmrl.rollout.vllm_server import VLLMServerEngine
        from mmrl.train.generation import Rollout

        self.weights, self.url = weights, cfg.rollout.vllm.server_url
        local = _ServerPolicy(policy)
        self.rollout = Rollout(cfg, local, envs, model=local.model)
        # The client that pushes the weights (and reads the server's fingerprint of them);
        # the Rollout's own client samples.
        self.engine = VLLMServerEngine.from_config(cfg.rollout.vllm, policy.codec)
        self.loaded, self.fp = -1, None

    def describe(self) -> str:
        return (f"the vLLM server at {self.url} samples while the trainer updates (weights pushed "
                f"by version, weight_transfer={self.engine.transfer}, before a batch)")

    def draw(self, prompts, published: int):
        if self.loaded < published:  # the newest staged weights, pushed before the batch starts
            state, version = self.weights.staged()
            self.engine.push_state(state)
            self.fp = self._server_fingerprint(list(state))
            self.loaded = version
        return self.rollout.generate(prompts), self.loaded, self.fp

    def _server_fingerprint(self, names: list[str]) -> torch.Tensor:
        """Every server worker's sums of the tensors it received, in the staged order; a
        tensor it did not receive reads as NaN (never matches)."""
        got = self.engine.loaded_fingerprints()
        first = got[0]
        for other in got[1:]:
            if other != first:
                raise RuntimeError("async rollout: the vLLM server's workers received different "
                                   "weights")
        nan = [float("nan"), float("nan")]
        return torch.tensor([first.get(n, nan) for n in names], dtype=torch.float64)

    def close(self) -> None:
        self.rollout.close()
