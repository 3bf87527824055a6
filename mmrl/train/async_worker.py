"""The async sampler's own process (mmrl/train/async_rollout.py): the HF engine on a copy of the
policy's weights, in a spawned process so that its Python work (the decode loop, tool calls)
runs beside the trainer's instead of taking turns with it for one interpreter lock.

What crosses the process boundary (torch.multiprocessing: tensors travel as shared memory):
- at start: the model copy, the processor, the settings, and the staging weights of the
  `WeightBox` (shared memory, written by the trainer under `lock`, with `version`);
- per batch: the prompts and the version published when the trainer handed them over; back: the
  RolloutBatch, the version of the weights that drew it and their fingerprint (computed here,
  from this process's own tensors, so a sync that did not arrive cannot pass for one that did).
"""
from __future__ import annotations

import os
import queue
import signal
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.multiprocessing as mp

if TYPE_CHECKING:
    from mmrl.models.codec import Codec


def fingerprint(tensors) -> torch.Tensor:
    """Per-tensor float64 sums and absolute sums: cheap, and any skipped tensor shows."""
    return torch.stack([torch.stack([t.detach().double().sum(), t.detach().double().abs().sum()])
                        for t in tensors]).cpu()


@dataclass
class SamplerSettings:
    """What the sampler process needs to build its `Rollout` (all picklable)."""
    rollout: object  # RolloutConfig
    tools: object  # ToolsConfig
    sequence: object  # the Policy's sequence group (size 1: async runs on one process)
    info: object  # DistInfo
    threads: int
    seed: int
    # The trainer's setting (the CLI flushes denormals: tiny-model CPU steps spike 10-20x on
    # them); a spawned process starts without it.
    flush_denormal: bool = False
    data: object = None  # DataConfig: tool results pass the records' media guards
    env: object = None  # EnvConfig: the trajectories' environment


def flushes_denormals() -> bool:
    """Whether this process flushes float32 denormals to zero (torch has no getter)."""
    return float(torch.tensor([1e-39], dtype=torch.float32).mul(1.0)) == 0.0


class _SamplerPolicy:
    """The few Policy members `Rollout` reads, over the sampler's model copy."""

    def __init__(self, model, codec: Codec, s: SamplerSettings):
        self.model, self.codec = model, codec
        self.sequence, self.info = s.sequence, s.info

    def full_params(self, enabled: bool = True):
        return nullcontext()


def _main(settings: SamplerSettings, model, codec: Codec, staging: dict, version, lock,
          requests, replies) -> None:
    """The sampler process: load the newest staged weights when asked, draw, reply."""
    from mmrl.config import DataConfig, EnvConfig, RunConfig
    from mmrl.train.generation import Rollout

    # The trainer decides when this process ends (signals.py: it finishes or abandons its step,
    # saves, then closes us); a Ctrl-C to the terminal's process group must not kill it first.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    torch.set_num_threads(settings.threads)
    torch.set_flush_denormal(settings.flush_denormal)
    torch.manual_seed(settings.seed)
    try:
        policy = _SamplerPolicy(model, codec, settings)
        run = RunConfig(rollout=settings.rollout, tools=settings.tools,
                        data=settings.data or DataConfig(), env=settings.env or EnvConfig())
        rollout = Rollout(run, policy, model=model)  # its own environments, in its process
        params = dict(model.named_parameters())
        loaded, fp, parent = -1, None, os.getppid()
        replies.put((True, os.getpid()))  # replies: (ok, payload), else (False, traceback)
        while True:
            try:
                request = requests.get(timeout=5.0)
            except queue.Empty:
                if os.getppid() != parent:  # the trainer died without closing us (SIGKILL)
                    break
                continue
            if request is None:
                break
            job_id, prompts, published = request
            if loaded < published:  # the newest weights, copied before the batch starts
                with lock, torch.no_grad():
                    for name, tensor in staging.items():
                        params[name].copy_(tensor)
                    loaded = version.value
                fp = fingerprint(params[name] for name in staging)
            replies.put((True, (job_id, rollout.generate(prompts), loaded, fp)))
        rollout.close()
    except BaseException:  # the trainer raises it with this traceback
        replies.put((False, traceback.format_exc()))


class ProcessWorker:
    """The trainer's handle on the sampler process: `draw` blocks (without the interpreter lock)
    until the process has drawn the batch."""

    def __init__(self, settings: SamplerSettings, model, codec: Codec, weights):
        """`weights`: the trainer's WeightBox; its staging tensors move to shared memory and its
        lock and version become the process-shared ones."""
        ctx = mp.get_context("spawn")  # a fork would copy the trainer's threads and locks
        weights.shared, weights.lock = ctx.Value("q", -1), ctx.Lock()
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        for tensor in weights.staging.values():
            tensor.share_memory_()
        model.share_memory()
        self.process = ctx.Process(target=_main, name="mmrl-sampler", daemon=True,
                                   args=(settings, model, codec, weights.staging,
                                         weights.shared, weights.lock, self.requests,
                                         self.replies))
        # Both processes keep every core (async_rollout.py says why): the sampler's idle OpenMP
        # threads sleep rather than spin against the trainer's.
        policy = os.environ.get("OMP_WAIT_POLICY")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by the child's OpenMP only
        try:
            self.process.start()
        finally:
            if policy is None:
                del os.environ["OMP_WAIT_POLICY"]
        self._jobs = 0
        self._reply()

    def _reply(self):
        while True:
            try:
                reply = self.replies.get(timeout=5.0)
            except queue.Empty:  # is the process still there?
                if not self.process.is_alive():
                    raise RuntimeError(f"the async sampler process died (exit code "
                                       f"{self.process.exitcode})") from None
                continue
            ok, payload = reply
            if not ok:
                raise RuntimeError(f"the async sampler process failed:\n{payload}")
            return payload

    def draw(self, prompts, published: int):
        """-> (RolloutBatch, version of the weights that drew it, their fingerprint)."""
        self._jobs += 1
        self.requests.put((self._jobs, prompts, published))
        job_id, batch, loaded, fp = self._reply()
        assert job_id == self._jobs
        return batch, loaded, fp

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)
