"""DAPO data-side pieces: dynamic sampling and overlong filtering. Pure; torch + stdlib only.

Dynamic sampling drops groups whose rewards are all equal (their group-relative advantage is 0,
so they only dilute the batch) and keeps sampling until enough informative groups are found::

    acc = GroupAccumulator(target_groups=cfg.batch_groups, max_rounds=cfg.max_rounds)
    while not acc.full:
        groups, scores, group_ids = sample_and_score()           # trainer's business
        ids, keep = groups_with_signal(scores, group_ids)          # keep: Bool[G], ids sorted
        acc.add([groups[i] for i in ids.tolist()], keep)           # groups: {id: obj}; raises after max_rounds
    batch = acc.take()                                             # exactly target_groups items

>>> import torch
>>> s = torch.tensor([1., 0., 1., 1., 0., 0.]); g = torch.tensor([5, 5, 9, 9, 2, 2])
>>> group_has_signal(s, g).tolist()
[True, True, False, False, False, False]
>>> frac_zero_std_groups(s, g)
0.6666666666666666
>>> frac_solved_groups(s, g)  # group 9 scored the step's best in every completion
0.3333333333333333
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import Tensor


def _group_range(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(unique ids [G], inverse [N], max - min of each group [G]), vectorised."""
    if scores.dim() != 1 or scores.shape != group_ids.shape:
        raise ValueError(
            f"scores and group_ids must both be 1-D of equal length; got "
            f"{tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    r = scores.detach().to(torch.float64)
    ids, inv = torch.unique(group_ids, return_inverse=True)
    gmax = r.new_zeros(ids.numel()).scatter_reduce_(0, inv, r, "amax", include_self=False)
    gmin = r.new_zeros(ids.numel()).scatter_reduce_(0, inv, r, "amin", include_self=False)
    return ids, inv, gmax - gmin


def groups_with_signal(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Per group: (sorted unique ids [G], keep [G]) with keep = max_g - min_g > eps.

    The range is used rather than the std because it is exact for "all equal" and needs no
    degrees-of-freedom choice; a group of one has range 0, i.e. no signal.
    """
    ids, _, spread = _group_range(scores, group_ids)
    return ids, spread > eps


def group_has_signal(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Bool[N]: True where the row's group has scores that are not all equal (range > eps)."""
    _, inv, spread = _group_range(scores, group_ids)
    return (spread > eps)[inv]


def frac_zero_std_groups(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> float:
    """Fraction of *groups* (not rows) whose scores are all equal (range <= eps); 0.0 if empty."""
    ids, keep = groups_with_signal(scores, group_ids, eps)
    return 0.0 if ids.numel() == 0 else float((~keep).sum().item()) / ids.numel()


def frac_solved_groups(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> float:
    """Fraction of groups whose completions all scored the step's best score (alike because the
    prompt is solved, when that best is the run's: train/watch.py). 0.0 if empty."""
    if scores.numel() == 0:
        return 0.0
    ids, inv, spread = _group_range(scores, group_ids)
    r = scores.detach().to(torch.float64)
    low = r.new_zeros(ids.numel()).scatter_reduce_(0, inv, r, "amin", include_self=False)
    solved = (spread <= eps) & (low >= r.max() - eps)
    return float(solved.sum().item()) / ids.numel()


def overlong_filter_mask(mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO overlong filtering: zero the loss mask of completions cut off at the length budget.

    mask [N, L] (bool or float), truncated Bool[N] -> new mask, same dtype; the input is not
    modified. Truncated rows still count in N for the seq_* aggregations.
    """
    if truncated.shape != mask.shape[:1]:
        raise ValueError(f"truncated must be [N={mask.shape[0]}]; got {tuple(truncated.shape)}")
    keep = ~truncated.to(device=mask.device, dtype=torch.bool)
    if mask.dtype == torch.bool:
        return mask & keep.unsqueeze(-1)
    return mask * keep.unsqueeze(-1).to(mask.dtype)


class GroupAccumulator:
    """Collect kept groups (arbitrary Python objects) across sampling rounds until ``full``.

    ``add(items, keep)`` appends the items whose keep flag is true and counts one round. If the
    target is still not reached after ``max_rounds`` rounds it raises RuntimeError, because an
    endless loop on a too-easy or too-hard dataset is worse than a clear stop.
    """

    def __init__(self, target_groups: int, max_rounds: int):
        if target_groups < 1 or max_rounds < 1:
            raise ValueError(f"need target_groups >= 1 and max_rounds >= 1; got {target_groups}, {max_rounds}")
        self.target_groups = int(target_groups)
        self.max_rounds = int(max_rounds)
        self.items: list[Any] = []
        self.round = 0  # rounds added so far
        self.seen = 0  # groups offered so far (kept or not)

    @property
    def full(self) -> bool:
        return len(self.items) >= self.target_groups

    @property
    def kept(self) -> int:
        return len(self.items)

    def add(self, items: Sequence[Any], keep: Tensor | Iterable[bool]) -> int:
        """Add one round; returns how many of ``items`` were kept. ``keep`` has one flag per item."""
        flags = keep.tolist() if isinstance(keep, Tensor) else list(keep)
        if len(flags) != len(items):
            raise ValueError(f"keep has {len(flags)} flags for {len(items)} items")
        before = len(self.items)
        self.items.extend(item for item, k in zip(items, flags) if k)
        self.round += 1
        self.seen += len(flags)
        if not self.full and self.round >= self.max_rounds:
            raise RuntimeError(
                f"dynamic sampling: after {self.round} rounds only {self.kept} of the "
                f"{self.target_groups} target groups had non-zero reward std ({self.seen} groups "
                f"sampled). Lower the target number of groups, raise max_rounds, or disable "
                f"dynamic sampling."
            )
        return len(self.items) - before

    def take(self) -> list[Any]:
        """The first ``target_groups`` kept items (the surplus of the last round is dropped, as in DAPO)."""
        if not self.full:
            raise RuntimeError(f"accumulator not full: {self.kept} of {self.target_groups} groups")
        return self.items[: self.target_groups]

    def reset(self) -> None:
        self.items, self.round, self.seen = [], 0, 0


# ---------------------------------------------------------------- history-aware filtering ------
HISTORY_MODES = ("skip", "downweight")


class PromptHistory:
    """Variance-aware prompt selection across epochs (ReST-GRPO, Temporal-R1 style).

    For every prompt key (a sample id) it keeps whether each of its last ``k`` groups was
    uninformative: every sample got the same reward (all solved, or none: the test dynamic
    sampling uses, so it holds for any reward mix). A prompt is *filtered* once its last ``k``
    groups were all uninformative; the trainer then skips it or down-weights its advantages.

    Groups seen during a step are ``observe``d into a pending buffer and only ``commit``ted at the
    end of the step, so a step's own outcome never decides that step's weights. State (for
    checkpoints) is plain lists of bools.

    >>> h = PromptHistory(k=2)
    >>> for _ in range(2):
    ...     h.observe(["a", "a", "b", "b"], torch.tensor([1., 1., 1., 0.]), torch.tensor([0, 0, 1, 1]))
    ...     h.commit()
    >>> h.filtered("a"), h.filtered("b")
    (True, False)
    """

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"history k must be >= 1; got {k}")
        self.k = int(k)
        self.flags: dict[str, list[bool]] = {}
        self.pending: list[tuple[str, bool]] = []

    def observe(self, keys: Sequence[str], scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> None:
        """Buffer one flag per group: keys [N] give each row's prompt key (equal within a group)."""
        if len(keys) != scores.numel():
            raise ValueError(f"{len(keys)} keys for {scores.numel()} rows")
        ids, keep = groups_with_signal(scores, group_ids, eps)
        first = {int(g): i for i, g in reversed(list(enumerate(group_ids.tolist())))}
        self.pending.extend((str(keys[first[int(g)]]), not bool(k)) for g, k in zip(ids, keep))

    def commit(self) -> None:
        for key, flat in self.pending:
            self.flags[key] = (self.flags.get(key, []) + [flat])[-self.k:]
        self.pending = []

    def filtered(self, key: str) -> bool:
        h = self.flags.get(str(key), [])
        return len(h) == self.k and all(h)

    def rest(self, key: str) -> None:
        """A skipped visit: the oldest flag is dropped, so the prompt, filtered now, is drawn
        again on its next pass and filtered again only by a new uninformative group."""
        self.flags[str(key)] = self.flags.get(str(key), [])[1:]

    def row_weights(self, keys: Sequence[str], weight: float) -> Tensor:
        """Float[N]: ``weight`` for rows of filtered prompts, 1.0 elsewhere (mode downweight)."""
        return torch.tensor([weight if self.filtered(k) else 1.0 for k in keys], dtype=torch.float32)

    def state_dict(self) -> dict:
        return {"k": self.k, "flags": {k: list(v) for k, v in self.flags.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.flags = {k: [bool(x) for x in v][-self.k:] for k, v in state["flags"].items()}
        self.pending = []
