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
- the rollout: every rank of a sequence group generates the same prompts from the same seed (so
  ZeRO-3's and FSDP2's collectives inside generation stay in step, at no wall-clock cost: the
  group would wait for one generating rank anyway), then the group's first rank's completions
  are broadcast over the group (`from_first_rank`): identical rows by construction, even where
  sampling kernels are not bit-deterministic.
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


def from_first_rank(obj, sequence: SPGroup, world_rank: int):
    """`obj` as the first rank of this process's sequence group has it, on every rank of the
    group (a collective over the group; `world_rank`: this process's rank in the world)."""
    if sequence.size == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=world_rank - sequence.rank, group=sequence.group)
    return box[0]
