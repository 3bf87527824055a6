"""Asynchronous rollouts with bounded staleness: `rollout.max_staleness: k` >= 1 (docs/async.md).

A sampler process (mmrl/train/async_worker.py) draws batches from its *own copy* of the
policy's weights with the HF engine (tools and every modality as in the synchronous loop: the
same `Rollout`, over the copy) while the trainer updates the policy; a dispatcher thread here
hands it the batches as the staleness bound allows. The contract:

- **Versions.** The weights' version is the number of updates done (`Trainer.step`). After each
  update the trainer publishes its trainable weights (LoRA adapters included) to a staging copy
  in shared memory, with the version, and keeps their fingerprint (per-tensor float64 sums).
  The sampler loads the newest staged weights before every batch, never in the middle of one:
  sync happens while it samples.
- **Bounded staleness.** Each batch carries the version that drew it. A batch meant to be trained
  at version v starts only once version v - k is published, and at take time a batch with
  `version_now - version > k` is not trained on: its prompts go back to the queue and are drawn
  again with newer weights (counted, `async/requeued`), never dropped (dropping biases training
  towards the prompts that sample fast).
- **Version check.** A batch drawn with a version older than the one published when it started
  (a skipped sync), or whose weights' fingerprint differs from the trainer's at that version (an
  incomplete sync, e.g. an adapter left out), stops the run with an error: old weights are
  never used silently.
- **Loss.** The Learner weights each token by pi_prox / pi_behav (the sampler's logprobs; the
  IS knobs algo.tis_*): AReaL's decoupled objective, mmrl/algos/decoupled.py.
- **Resume.** A checkpoint stores the dataset indices of every batch submitted and not yet
  trained (queued, being drawn, drawn); a resumed run draws them again first, so no prompt is
  trained twice and none is lost. The samples themselves are redrawn (with the resumed weights).

Only the trainer's thread touches the PromptSource, the Scorer and the policy's weights; the
sampler process touches its model copy, the engine and the staging copy (under a lock).
"""
from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mmrl.config import RunConfig
from mmrl.train.async_worker import ProcessWorker, SamplerSettings, fingerprint, flushes_denormals
from mmrl.types import PromptFeatures, RolloutBatch

if TYPE_CHECKING:
    from mmrl.train.policy import Policy
    from mmrl.train.prompts import PromptSource

IN_FLIGHT = "async_in_flight"  # the trainer's extra state key of `AsyncRollout.state_dict()`


class WeightBox:
    """The trainer's trainable weights for the sampler: a staging copy with its version (both
    shared with the sampler process, `lock` and `shared` set by the worker), and the
    fingerprints of the trainer's own weights at the last versions (what a drawn batch is
    checked against)."""

    def __init__(self, model: torch.nn.Module, keep: int):
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self.staging = {n: params[n].detach().clone() for n in self.names}
        self.version: int | None = None
        self.fingerprints: dict[int, torch.Tensor] = {}
        self.keep, self.lock, self.shared = keep, threading.Lock(), None

    def publish(self, model: torch.nn.Module, version: int) -> None:
        params = dict(model.named_parameters())
        self.fingerprints[version] = fingerprint(params[n] for n in self.names)
        with self.lock, torch.no_grad():
            for n in self.names:
                self.staging[n].copy_(params[n].detach())
            self.version = version
            if self.shared is not None:
                self.shared.value = version
        for old in [v for v in self.fingerprints if v < version - self.keep]:
            del self.fingerprints[old]

    def matches(self, version: int, fp: torch.Tensor) -> bool:
        expected = self.fingerprints.get(version)
        return expected is not None and torch.allclose(fp, expected, rtol=1e-9, atol=1e-12)


@dataclass(eq=False)
class _Job:
    indices: list[int]
    prompts: list[PromptFeatures]
    train_at: int  # the version it is meant to be trained at (gates its start)
    cancelled: bool = False


@dataclass
class _Drawn:
    job: _Job
    batch: RolloutBatch
    version: int  # the weights the sampler held while drawing
    fingerprint: torch.Tensor
    published: int  # the newest version published when the draw started
    seconds: float
    done_at: float = field(default_factory=time.perf_counter)


class AsyncRollout:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("take", "publish", "mark", "rewind", "state_dict", "load_state_dict", "close",
              "describe", "weights")

    def __init__(self, cfg: RunConfig, policy: Policy, prompts: PromptSource):
        self.k, self.b, self.total = (cfg.rollout.max_staleness, cfg.rollout.prompts_per_step,
                                      cfg.train.steps)
        self.policy, self.prompts = policy, prompts
        # Both sides keep every torch thread: each phase mostly runs while the other waits or
        # does Python work, and splitting the cores halved each side's speed (measured on the
        # quickstart, 2 cores: x0.71-1.11 split, x1.68 not; docs/benchmarks.md).
        self.sampler_threads = torch.get_num_threads()
        if cfg.rollout.runs_hf_generate:
            self.weights = WeightBox(policy.model, keep=self.k + 2)
            model = copy.deepcopy(policy.model)  # the sampler's own weights
            model.requires_grad_(False)
            self.worker = ProcessWorker(
                SamplerSettings(cfg.rollout, cfg.tools, policy.sequence, policy.info,
                                self.sampler_threads, cfg.train.seed + 1, flushes_denormals(),
                                cfg.data, cfg.env),
                model, policy.codec, self.weights)
        else:  # a vLLM server (config_rules refuses colocated vLLM): async_server.py
            from mmrl.train.async_server import ServerWeights, ServerWorker

            self.weights = ServerWeights(policy.codec.adapter, keep=self.k + 2)
            self.worker = ServerWorker(cfg, policy, self.weights, prompts.envs)
        self._cond = threading.Condition()
        self._todo: deque[_Job] = deque()  # submitted, not started
        self._ready: deque[_Drawn] = deque()  # drawn, not yet taken
        self._outstanding: list[_Job] = []  # every submitted job not trained yet, in order
        self._error: BaseException | None = None
        self._closed, self._mark = False, None
        self.requeued, self.hist = 0, [0] * (self.k + 1)  # staleness of the batches trained
        self._thread = threading.Thread(target=self._loop, name="mmrl-dispatch", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        if isinstance(self.worker, ProcessWorker):
            return (f"rollout.max_staleness={self.k}: asynchronous rollouts: the HF engine samples "
                    f"in its own process (pid {self.worker.process.pid}) from its own copy of the "
                    f"weights (synced by version after each update, up to {self.k} version(s) "
                    f"behind; torch threads: {self.sampler_threads} each)")
        return (f"rollout.max_staleness={self.k}: asynchronous rollouts: "
                f"{self.worker.describe()}; up to {self.k} version(s) behind")

    # ---------------------------------------------------------------- trainer side -------------
    def publish(self, version: int) -> None:
        """After an update (and before the first batch): the policy's weights at `version`."""
        self.weights.publish(self.policy.model, version)
        with self._cond:
            self._cond.notify_all()

    def take(self, version: int) -> tuple[RolloutBatch, dict[str, float]]:
        """The next batch fit to train at `version` (updates done) -> (batch, async metrics)."""
        if self.weights.version is None:  # RL starts: the sampler's first weights
            self.publish(version)
        self._top_up(version)
        waited, requeued = time.perf_counter(), 0
        while True:
            drawn = self._next_drawn()
            self._check(drawn)
            staleness = version - drawn.version
            if staleness <= self.k:
                break
            requeued += 1  # too old: its prompts are drawn again, never dropped
            self._requeue(drawn.job, version)
        self._outstanding.remove(drawn.job)
        self.hist[staleness] += 1
        self.requeued += requeued
        n = sum(self.hist)
        metrics = {"async/staleness": float(staleness),
                   "async/staleness_mean": sum(s * c for s, c in enumerate(self.hist)) / n,
                   "async/staleness_max": float(max(s for s, c in enumerate(self.hist) if c)),
                   **{f"async/staleness_{s}": float(c) for s, c in enumerate(self.hist)},
                   "async/requeued": float(self.requeued),
                   "async/wait_s": time.perf_counter() - waited,
                   "async/queue_age_s": time.perf_counter() - drawn.done_at,
                   "async/sample_s": drawn.seconds, "async/ready": float(len(self._ready))}
        return drawn.batch, metrics

    def _top_up(self, version: int) -> None:
        """Submit prompts until k + 1 batches are outstanding (none past the last step)."""
        while (len(self._outstanding) < self.k + 1
               and version + len(self._outstanding) < self.total):
            prompts = self.prompts.next(self.b)
            self._submit(_Job(list(self.prompts.last_drawn), prompts,
                              version + len(self._outstanding)))

    def _submit(self, job: _Job, front: bool = False) -> None:
        with self._cond:
            (self._todo.appendleft if front else self._todo.append)(job)
            self._cond.notify_all()
        if not front:
            self._outstanding.append(job)

    def _requeue(self, job: _Job, version: int) -> None:
        fresh = _Job(job.indices, job.prompts, version)
        self._outstanding[self._outstanding.index(job)] = fresh
        self._submit(fresh, front=True)

    def _next_drawn(self) -> _Drawn:
        with self._cond:
            while not self._ready and self._error is None:
                self._cond.wait(timeout=1.0)  # the timeout lets a stop signal through
            if self._error is not None:
                raise RuntimeError(f"the async sampler failed: {self._error!r}") \
                    from self._error
            return self._ready.popleft()

    def _check(self, drawn: _Drawn) -> None:
        """Old weights are never used silently (module docstring, "Version check")."""
        if drawn.version < drawn.published:
            raise RuntimeError(
                f"async rollout: a batch was drawn with the weights of version {drawn.version} "
                f"while version {drawn.published} was published: the sampler skipped a weight "
                f"sync")
        if not self.weights.matches(drawn.version, drawn.fingerprint):
            raise RuntimeError(
                f"async rollout: the sampler's weights for version {drawn.version} differ from "
                f"the trainer's at that version (fingerprint mismatch): a weight sync was "
                f"incomplete")

    # ---------------------------------------------------------------- dispatcher thread --------
    def _loop(self) -> None:
        """Hands each job to the sampler process once the staleness bound lets it start."""
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._startable():
                        self._cond.wait()
                    if self._closed:
                        return
                    job, published = self._todo.popleft(), self.weights.version
                started = time.perf_counter()
                batch, version, fp = self.worker.draw(job.prompts, published)
                drawn = _Drawn(job, batch, version, fp, published, time.perf_counter() - started)
                with self._cond:
                    if not job.cancelled:
                        self._ready.append(drawn)
                    self._cond.notify_all()
        except BaseException as e:  # handed to the trainer's thread, which raises it
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _startable(self) -> bool:
        v = self.weights.version
        return bool(self._todo) and v is not None and v >= self._todo[0].train_at - self.k

    # ---------------------------------------------------------------- stop / resume ------------
    def mark(self) -> None:
        """At a step's start: what `rewind` returns to (signals.py may abandon the step)."""
        self._mark = list(self._outstanding)

    def rewind(self) -> None:
        """Back to the step's start: the jobs outstanding then (the one taken included) stay
        pending for the checkpoint; the rest is cancelled (the PromptSource rewinds too)."""
        with self._cond:
            for job in self._outstanding + list(self._todo):
                job.cancelled = True
            self._todo.clear()
            self._ready.clear()
        self._outstanding = list(self._mark or [])

    def state_dict(self) -> dict:
        return {"pending": [list(job.indices) for job in self._outstanding],
                "requeued": self.requeued, "hist": list(self.hist)}

    def load_state_dict(self, state: dict, version: int) -> None:
        """A resumed run's in-flight batches, drawn again first (before any new prompt)."""
        self.requeued = state.get("requeued", 0)
        hist = list(state.get("hist", []))[:self.k + 1]
        self.hist = hist + [0] * (self.k + 1 - len(hist))
        for indices in state.get("pending", []):
            kept, _, prompts = self.prompts.load(indices)
            if prompts:
                self._submit(_Job(kept, prompts, version + len(self._outstanding)))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._todo:
                job.cancelled = True
            self._cond.notify_all()
        self._thread.join(timeout=120)
        self.worker.close()
