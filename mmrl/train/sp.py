"""The process layout under sequence parallelism: data-parallel groups x sequence-parallel groups.

`train.sequence_parallel: N` splits every forward's sequence over N consecutive ranks (one
sequence-parallel group, on one node where the all-to-alls are fast); the world of D x N ranks
holds D data-parallel ranks. Ranks r = d * N + s: data-parallel rank d, sequence rank s.

Which group each part of a step runs over (models/ulysses.py says why):
- the sample slice (`dist.local_slice`), rewards and advantages (`dist.gather_cat`), the loss
  normaliser (`dist.all_sum`) and metric means: the data-parallel view `Layout.data` -- the N
  ranks of one sequence group hold the same rows and must count them once;
- gradients: the whole world (`Layout.world`): each rank holds a disjoint part of its
  data-parallel rank's gradient, so DDP's all-reduce, ZeRO's and FSDP2's reductions over every
  process stay as they are, and so does their loss scaling by the world size;
- files (logs, checkpoints): world rank 0 (`Layout.world.main`; `Layout.data.main` is true on
  every rank of the first sequence group);
- the rollout: each rank of a sequence group samples its contiguous share of the group's
  prompts and the group exchanges the completions (`share`, `gather_objects`): every row is
  sampled once, by one rank, so the group's copies are identical by construction (seeding
  alike would not be: sampling kernels on GPUs are not bit-exact), and each process's rollout
  costs what it costs without sequence parallelism on as many processes
  (`rollout.prompts_per_step` must divide by the process count: each samples whole groups).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as torch_dist

from mmrl.models.ulysses import SPGroup
from mmrl.train.dist import DistInfo


@dataclass(frozen=True)
class Layout:
    world: DistInfo  # every process
    data: DistInfo  # rank / world over data-parallel ranks, collectives over the data group
    sequence: SPGroup  # the ranks sharing this rank's micro-batches


def make_layout(info: DistInfo, size: int) -> Layout:
    """The groups for `train.sequence_parallel = size` on `info.world` processes (a collective:
    every process calls it, in the same order)."""
    if size < 1 or info.world % size:
        raise ValueError(f"train.sequence_parallel={size}: must divide the process count "
                         f"{info.world} (each data-parallel rank is `size` whole processes)")
    if size == 1:
        return Layout(info, info, SPGroup())
    data_size = info.world // size
    sequence_group = data_group = None
    for d in range(data_size):  # every rank creates every group, in the same order
        group = torch_dist.new_group([d * size + s for s in range(size)])
        if info.rank // size == d:
            sequence_group = group
    for s in range(size):
        group = torch_dist.new_group([d * size + s for d in range(data_size)])
        if info.rank % size == s:
            data_group = group
    data = DistInfo(info.rank // size, data_size, info.local_rank, group=data_group)
    return Layout(info, data, SPGroup(sequence_group, info.rank % size, size))


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of `rank`'s contiguous share of `n` items over `size` ranks."""
    per = n // size
    return rank * per, (rank + 1) * per if rank < size - 1 else n


def gather_objects(obj, sequence: SPGroup) -> list:
    """Every rank's `obj`, in sequence-rank order, on every rank of the group (a collective)."""
    if sequence.size == 1:
        return [obj]
    out = [None] * sequence.size
    torch_dist.all_gather_object(out, obj, group=sequence.group)
    return out
