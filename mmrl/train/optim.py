"""The optimizer and its learning-rate schedule, as the Learner's strategy builds them.

Apart from learner.py because the strategies (train/parallel.py) build the optimizer themselves:
FSDP2 on its sharded parameters, ZeRO-Offload with DeepSpeed's CPU Adam.
"""
from __future__ import annotations

import math

import torch

from mmrl.config import TrainConfig

# The learning-rate factor after warm-up per train.lr_schedule, from the share of those steps done.
LR_SCHEDULES = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: max(0.0, 1.0 - progress),
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))),
}


def build_optimizer(tc: TrainConfig, model, total_steps: int, optimizer_class=torch.optim.AdamW):
    """-> (AdamW-style optimizer over the trainable parameters, its LR scheduler).
    `optimizer_class` takes AdamW's arguments (DeepSpeed's CPU Adam does, in AdamW mode)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer_class(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
    return opt, lr_schedule(opt, tc, total_steps)


def lr_schedule(opt, tc: TrainConfig, total_steps: int):
    def factor(step: int) -> float:
        # Warm-up matters for RL on a fresh optimizer: without it early steps overshoot
        # (observed collapses: docs/install-notes.md).
        if step < tc.warmup_steps:
            return (step + 1) / tc.warmup_steps
        progress = (step - tc.warmup_steps) / max(1, total_steps - tc.warmup_steps)
        return LR_SCHEDULES[tc.lr_schedule](progress)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)
