"""Data-parallel training over torch.distributed (torchrun / accelerate launch / SLURM).

Every rank draws the same global batch of prompts and keeps its contiguous slice, so groups stay
whole on one rank. Rewards are gathered so advantages are computed on the global batch (batch-
level whitening such as REINFORCE++ needs every rank's scores), the loss normaliser is global,
and gradients are summed with one all-reduce per step. A manual all-reduce rather than DDP's
hooks: a rank whose micro-batch has no image leaves the vision tower without gradient, which
hangs DDP (and ZeRO-3) - here it simply contributes zeros.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # The process group the collectives below run over (None: every process). Under sequence
    # parallelism the data-parallel view (train/sp.py) names its data-parallel group here.
    group: object = None

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init() -> DistInfo:
    """Join the process group when launched by torchrun/accelerate (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not torch_dist.is_initialized():
        # NCCL for GPU tensors, gloo for the CPU ones (counts, flags and metrics reduced here).
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        torch_dist.init_process_group(backend=backend)
    info = DistInfo(torch_dist.get_rank(), torch_dist.get_world_size(),
                    int(os.environ.get("LOCAL_RANK", "0")))
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank)
    return info


def local_slice(n_global: int, info: DistInfo) -> slice:
    if n_global % info.world:
        raise ValueError(f"rollout.prompts_per_step={n_global} must be divisible by the number of "
                         f"processes ({info.world}) so every rank gets whole groups")
    per = n_global // info.world
    return slice(info.rank * per, (info.rank + 1) * per)


def gather_cat(t: torch.Tensor, info: DistInfo) -> tuple[torch.Tensor, int]:
    """(1-D tensors of every rank concatenated in rank order, where this rank's part starts)."""
    if not info.enabled:
        return t, 0
    size = torch.tensor([t.numel()], device=t.device)
    sizes = [torch.zeros_like(size) for _ in range(info.world)]
    torch_dist.all_gather(sizes, size, group=info.group)
    counts = [int(s.item()) for s in sizes]
    padded = torch.nn.functional.pad(t, (0, max(counts) - t.numel()))
    parts = [torch.zeros_like(padded) for _ in range(info.world)]
    torch_dist.all_gather(parts, padded, group=info.group)
    return torch.cat([p[:c] for p, c in zip(parts, counts)]), sum(counts[:info.rank])


def all_sum(x: float | torch.Tensor, info: DistInfo) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).clone()
    if info.enabled:
        torch_dist.all_reduce(t, group=info.group)
    return t


def all_max(x: int, info: DistInfo) -> int:
    """The largest `x` over the ranks (every rank must call it)."""
    t = torch.tensor(x, dtype=torch.long)
    if info.enabled:
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX, group=info.group)
    return int(t)


def mean_metrics(metrics: dict[str, float], info: DistInfo) -> dict[str, float]:
    """Average scalar metrics over ranks (same keys on every rank, sorted for a stable order)."""
    if not info.enabled:
        return metrics
    keys = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    torch_dist.all_reduce(t, group=info.group)
    return {**metrics, **{k: float(v) / info.world for k, v in zip(keys, t.tolist())}}


def all_reduce_grads(params: list[torch.Tensor], info: DistInfo, average: bool = False) -> None:
    """Sum (or average) gradients over ranks in one flat buffer; missing grads count as zero."""
    if not info.enabled:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in params])
    torch_dist.all_reduce(flat, group=info.group)
    if average:
        flat /= info.world
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def broadcast_object(obj, info: DistInfo):
    """Rank 0's `obj` on every rank (a decision only rank 0 takes, e.g. the checkpoint to
    resume from after verifying it)."""
    if not info.enabled:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj, info: DistInfo) -> list:
    """Every rank's `obj`, in rank order, on every rank (picklable objects: evaluation rows)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world
    torch_dist.all_gather_object(out, obj, group=info.group)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        torch_dist.barrier(group=info.group)


def destroy(info: DistInfo) -> None:
    if info.enabled and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
