"""The prompt source: which training samples a step sees, decoded and processed once.

It owns the sampler (a resumable epoch-wise order, `PromptSampler`), the media loader (decode
budgets, disk cache, counted truncations), a bounded cache of processed prompts, and the
bad-sample policy; with the methods on (mmrl/train/methods.py), the prompt history that skips or
down-weights prompts without signal. Its state (sampler position, skip count, prompt history) is
part of every checkpoint.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import torch

from mmrl.config import RunConfig
from mmrl.data.media import MediaError
from mmrl.data.prepare import media_loader
from mmrl.rollout.environments import make_environments, prompt_features
from mmrl.train import dist
from mmrl.train.methods import HistoryFilter
from mmrl.types import PromptFeatures, RolloutBatch, Sample

if TYPE_CHECKING:
    from mmrl.models.codec import Codec


class PromptSource:
    # What other files may read (tests/train/test_structure.py checks it).
    PUBLIC = ("dataset", "envs", "features", "next", "load", "group_base", "observe",
              "weight_advantages", "end_step", "metrics", "say", "skip_summary", "state_dict",
              "load_state_dict", "last_drawn")

    def __init__(self, cfg: RunConfig, dataset: Sequence[Sample], codec: Codec,
                 info: dist.DistInfo, envs=None):
        """`envs`: the run's environment kind (built once per run; None: built here), whose
        reset makes each prompt."""
        self.dataset, self.codec, self.info = dataset, codec, info
        self.cache_size, self.skips_bad_samples = cfg.data.feature_cache, cfg.data.skips_bad_samples
        self.media_stats: dict[str, int] = {}  # e.g. audio_truncated, counted into metrics
        self.load_media = media_loader(cfg, codec.image_factor, self.media_stats)
        self.sampler = PromptSampler(len(dataset), cfg.train.seed, cfg.data.shuffle,
                                     blocks=getattr(dataset, "blocks", None))
        self.history = HistoryFilter.make(cfg.algo)
        self.bad = BadRecords(len(dataset), cfg.data.max_bad_fraction)
        self.say = print  # the trainer's log.warn once it exists
        # Every prompt is the environment's first user turn (with tools: the tools offered).
        self.envs = envs if envs is not None else make_environments(cfg, codec)
        self._features: OrderedDict[int, PromptFeatures] = OrderedDict()
        self.last_drawn: list[int] = []  # the dataset indices `next` returned last (async queue)

    def features(self, sample: Sample, key: int | None = None) -> PromptFeatures:
        """One processor call per sample, reused by rollout and every training forward."""
        if key is not None and key in self._features:
            self._features.move_to_end(key)
            return self._features[key]
        feats = prompt_features(self.envs, self.codec, sample, self.load_media)
        if key is not None and self.cache_size > 0:  # bounded: media tensors are big
            self._features[key] = feats
            while len(self._features) > self.cache_size:
                self._features.popitem(last=False)
        return feats

    def next(self, n: int) -> list[PromptFeatures]:
        """Draw n prompts (the global batch: every rank draws the same ones and keeps its slice,
        so groups stay whole); bad media raises (on_bad_sample=error) or is skipped and counted,
        and a replacement drawn (locally, so ranks' orders may then drift apart), until the
        share of bad records in the epoch, or a run of them, says the data is broken."""
        todo = [self.sampler.next() for _ in range(n)][dist.local_slice(n, self.info)]
        want, out, in_a_row = len(todo), [], 0
        self.last_drawn = []
        while len(out) < want:
            idx = todo.pop(0) if todo else self.sampler.next()
            try:  # a record's embedded media decode when it is read: the history reads it too
                if self.history is not None and self.history.skips(self.dataset[idx]):
                    continue
                out.append(self._features_of(idx))
                self.last_drawn.append(idx)
                self.bad.tried(self.sampler.epoch, ok=True)
                in_a_row = 0
            except MediaError as e:
                self._skip(idx, e)
                self.bad.tried(self.sampler.epoch, ok=False)
                in_a_row += 1
                self.bad.check(in_a_row, want)
        return out

    def load(self, indices: list[int]
             ) -> tuple[list[int], list[Sample], list[PromptFeatures]]:
        """The indices of the samples that load, the samples and their features (SFT warm-up
        batches); bad media follows the same policy as `next`."""
        kept, samples, feats = [], [], []
        for idx in indices:
            try:
                feats.append(self._features_of(idx))
                samples.append(self.dataset[idx])
                kept.append(idx)
            except MediaError as e:
                self._skip(idx, e)
        return kept, samples, feats

    def _features_of(self, idx: int) -> PromptFeatures:
        if idx in self.bad.known:  # failed before in this process: said once, not decoded again
            raise MediaError(self.bad.known[idx])
        return self.features(self.dataset[idx], idx)

    def _skip(self, idx: int, error: MediaError) -> None:
        if not self.skips_bad_samples:
            raise MediaError(f"{error}\n(set data.on_bad_sample=skip to skip such samples "
                             f"and count them in metrics)") from None
        line = self.bad.skipped(idx, str(error))
        if line:
            self.say(line)

    @property
    def skipped(self) -> int:
        return self.bad.count

    def skip_summary(self) -> dict:
        """For summary.json: how many draws were skipped, and the first records and reasons."""
        return {"count": self.bad.count, "first": list(self.bad.first)}

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
        state = {"sampler": self.sampler.state_dict(), "skipped": self.bad.count,
                 "bad_records": self.bad.state_dict()}
        if self.history is not None:
            state["prompt_history"] = self.history.history.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.bad.count = state["skipped"]
        self.bad.load_state_dict(state.get("bad_records", {}))
        # Before the split the history was in the trainer's extra state.
        saved = state.get("prompt_history", state.get("extra", {}).get("prompt_history"))
        if self.history is not None and saved is not None:
            self.history.history.load_state_dict(saved)


class PromptSampler:
    """Epoch-wise shuffled order over sample indices; its state (epoch, position) is saved in
    checkpoints so a resumed run sees exactly the prompts the uninterrupted run would.

    `blocks` (sizes of consecutive index runs, e.g. Parquet row groups): the blocks are visited in
    a shuffled order and each block's indices shuffled within it, so consecutive draws share one
    row-group read while every epoch still visits every index once."""

    def __init__(self, n: int, seed: int, shuffle: bool = True, blocks: list[int] | None = None):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.blocks = blocks if blocks and sum(blocks) == n and len(blocks) > 1 else None
        self.epoch, self.pos = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        if self.blocks is None:
            return torch.randperm(self.n, generator=g).tolist()
        starts = [0]
        for size in self.blocks:
            starts.append(starts[-1] + size)
        order: list[int] = []
        for b in torch.randperm(len(self.blocks), generator=g).tolist():
            order += (torch.randperm(self.blocks[b], generator=g) + starts[b]).tolist()
        return order

    def next(self) -> int:
        if self.pos >= self.n:
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._make_order()
        self.pos += 1
        return self._order[self.pos - 1]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._make_order()


class BadRecords:
    """The skip policy's memory (data.on_bad_sample=skip). Every skipped record is printed once,
    with its file:line and reason, up to SHOWN of them, then counted only; the run stops when
    more than `max_fraction` of the records drawn in the current epoch failed (counted per
    epoch: a bad record fails again every epoch, so a cumulative count against the data set's
    size killed healthy runs with 25% missing images), or when one step meets IN_A_ROW bad
    records in a row (a wrong media root: every record fails), naming the first few."""

    SHOWN, IN_A_ROW, MIN_TRIED = 20, 256, 100

    def __init__(self, size: int, max_fraction: float):
        self.size, self.max_fraction = size, max_fraction
        self.count, self.first = 0, []  # skipped draws (all epochs); first reasons
        self.epoch, self.epoch_tried, self.epoch_bad = 0, 0, 0
        self.known: dict[int, str] = {}  # this process: index -> reason

    def skipped(self, idx: int, reason: str) -> str | None:
        """Count a skip -> the line to print (None: printed before, or past SHOWN)."""
        self.count += 1
        if idx in self.known:
            return None
        self.known[idx] = reason
        if len(self.first) < self.SHOWN:
            self.first.append(reason)
            return f"skipped {reason}"
        if len(self.first) == self.SHOWN:
            self.first.append(f"... more skipped records are counted, not printed")
            return (f"more than {self.SHOWN} records skipped: further ones are counted "
                    f"(data/skipped in metrics.jsonl, skipped_records in summary.json)")
        return None

    def tried(self, epoch: int, ok: bool) -> None:
        if epoch != self.epoch:
            self.epoch, self.epoch_tried, self.epoch_bad = epoch, 0, 0
        self.epoch_tried += 1
        self.epoch_bad += not ok

    def check(self, in_a_row: int, want: int) -> None:
        tried, bad = self.epoch_tried, self.epoch_bad
        first = "\n  ".join(self.first[:5])
        if in_a_row >= max(self.IN_A_ROW, 4 * want):
            raise TooManyBadRecords(
                f"{in_a_row} training records in a row failed to load, so a step cannot fill "
                f"its batch; the first:\n  {first}\ncheck the media paths (relative ones start "
                f"at the data file's folder; `mmrl data inspect FILE` lists every failing one)")
        if tried >= min(self.size, self.MIN_TRIED) and bad / tried > self.max_fraction:
            raise TooManyBadRecords(
                f"{bad} of the {tried} training records drawn in epoch {self.epoch + 1} failed "
                f"to load ({bad / tried:.0%}, over data.max_bad_fraction={self.max_fraction:g}); "
                f"the first:\n  {first}\nfix or drop them (`mmrl data inspect FILE` lists every "
                f"one), or raise data.max_bad_fraction")

    def state_dict(self) -> dict:
        return {"first": list(self.first),
                "epoch": [self.epoch, self.epoch_tried, self.epoch_bad]}

    def load_state_dict(self, state: dict) -> None:
        self.first = list(state.get("first", []))
        self.epoch, self.epoch_tried, self.epoch_bad = state.get("epoch", [0, 0, 0])


class TooManyBadRecords(RuntimeError):
    pass
