"""The prompt source: which training samples a step sees, decoded and processed once.

It owns the sampler (a resumable epoch-wise order), the media loader (decode budgets, disk
cache, counted truncations), a bounded cache of processed prompts, and the bad-sample policy;
with the methods on (mmrl/train/methods.py), the prompt history that skips or down-weights prompts without signal. Its state (sampler position,
skip count, prompt history) is part of every checkpoint.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from mmrl.config import RunConfig
from mmrl.data.media import MediaError, processor_errors
from mmrl.data.prepare import media_loader
import torch

from mmrl.train import dist, setup
from mmrl.train.methods import HistoryFilter
from mmrl.types import PromptFeatures, RolloutBatch, Sample


class PromptSource:
    def __init__(self, cfg: RunConfig, dataset: Sequence[Sample], adapter, processor,
                 info: dist.DistInfo):
        self.dataset, self.adapter, self.processor, self.info = dataset, adapter, processor, info
        self.cache_size, self.skips_bad_samples = cfg.data.feature_cache, cfg.data.skips_bad_samples
        self.media_stats: dict[str, int] = {}  # e.g. audio_truncated, counted into metrics
        self.load_media = media_loader(cfg, adapter.image_factor, self.media_stats)
        self.sampler = setup.PromptSampler(len(dataset), cfg.train.seed, cfg.data.shuffle,
                                           blocks=getattr(dataset, "blocks", None))
        self.history = HistoryFilter.make(cfg.algo)
        self.skipped = 0
        self._features: OrderedDict[int, PromptFeatures] = OrderedDict()

    def features(self, sample: Sample, key: int | None = None) -> PromptFeatures:
        """One processor call per sample, reused by rollout and every training forward."""
        if key is not None and key in self._features:
            self._features.move_to_end(key)
            return self._features[key]
        media = self.load_media(sample)
        with processor_errors(sample):  # e.g. aspect ratio: a media error naming the record
            feats = self.adapter.prompt_features(self.processor, sample, **media)
        feats.media = media
        if key is not None and self.cache_size > 0:  # bounded: media tensors are big
            self._features[key] = feats
            while len(self._features) > self.cache_size:
                self._features.popitem(last=False)
        return feats

    def next(self, n: int) -> list[PromptFeatures]:
        """Draw n prompts (the global batch: every rank draws the same ones and keeps its slice,
        so groups stay whole); bad media raises (on_bad_sample=error) or is skipped and counted
        (a replacement is drawn locally, so ranks' orders may then drift apart)."""
        todo = [self.sampler.next() for _ in range(n)][dist.local_slice(n, self.info)]
        want, out = len(todo), []
        while len(out) < want:
            idx = todo.pop(0) if todo else self.sampler.next()
            if self.history is not None and self.history.skips(self.dataset[idx]):
                continue
            try:
                out.append(self.features(self.dataset[idx], idx))
            except MediaError as e:
                self._skip(e)
                if self.skipped > len(self.dataset):
                    raise RuntimeError("every training sample failed to load") from e
        return out

    def load(self, indices: list[int]) -> tuple[list[Sample], list[PromptFeatures]]:
        """The samples at `indices` that load, and their features (SFT warm-up batches); bad
        media follows the same policy as `next`."""
        samples, feats = [], []
        for idx in indices:
            try:
                feats.append(self.features(self.dataset[idx], idx))
                samples.append(self.dataset[idx])
            except MediaError as e:
                self._skip(e)
        return samples, feats

    def _skip(self, error: MediaError) -> None:
        if not self.skips_bad_samples:
            raise MediaError(f"{error}\n(set data.on_bad_sample=skip to skip such samples "
                             f"and count them in metrics)") from None
        self.skipped += 1

    def group_base(self, n: int) -> int:
        """Group ids unique across ranks: rank r's groups start at r * (its share of n)."""
        return dist.local_slice(n, self.info).start

    # ------------------------------------------------ prompt history (algo.history_epochs) ---
    def observe(self, batch: RolloutBatch, scores: torch.Tensor) -> None:
        """Record each scored group's outcome (solved by all / none) for its prompt."""
        if self.history is not None:
            self.history.observe(batch, scores)

    def weight_advantages(self, adv: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        return adv if self.history is None else self.history.advantages(adv, batch)

    def end_step(self) -> dict[str, float]:
        """Commit the step's observations -> history metrics (none when off)."""
        return {} if self.history is None else self.history.end_step()

    def metrics(self) -> dict[str, float]:
        return {"data/skipped": self.skipped,
                **{f"data/{k}": v for k, v in self.media_stats.items()}}

    def state_dict(self) -> dict:
        state = {"sampler": self.sampler.state_dict(), "skipped": self.skipped}
        if self.history is not None:
            state["prompt_history"] = self.history.history.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.skipped = state["skipped"]
        # Before the split the history was in the trainer's extra state.
        saved = state.get("prompt_history", state.get("extra", {}).get("prompt_history"))
        if self.history is not None and saved is not None:
            self.history.history.load_state_dict(saved)
