"""Sample preparation in one place: what a run's config adds to the samples it loads, shared by
training (the Trainer), `mmrl eval` and `mmrl data inspect --config`, so all three see the same
prompts and sizes.

One pass per sample, in this order:

    template      data.prompt_template rewrites the question (mmrl/data/prompts.py)
    think mode    data.think_hybrid: the think or no-think instruction, chosen by a hash of the
                  sample id, so a held-out prompt is asked what training asks
    resized size  data.image_min/max_pixels: the frame the model sees, which box rewards map to

The image factor (pixels per merged patch side) belongs to the model family's adapter in
mmrl/models, which mmrl/data does not import: callers pass it in (`adapter.image_factor`).
Lazily read tables stay lazy: a sample is prepared when it is drawn.
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mmrl.data import synthetic
from mmrl.data.media import add_resized_sizes, load_media
from mmrl.data.prompts import apply_template
from mmrl.data.schema import LazySamples, load_samples
from mmrl.types import Sample

if TYPE_CHECKING:
    from mmrl.config import DataConfig, RunConfig


def build_datasets(cfg: RunConfig, image_factor: int) -> tuple[Sequence[Sample],
                                                               Sequence[Sample] | None]:
    """Train and eval samples, prepared; the synthetic dataset is generated first if asked for
    and missing."""
    d = cfg.data
    if d.generate:
        generate_once(d)
    train = load_samples(d.train, d.format, d.max_samples)
    evals = load_samples(d.eval, d.format, cfg.eval.max_samples) if d.eval else None
    prepare = functools.partial(prepare_samples, cfg=cfg, image_factor=image_factor)
    return prepare(train), (prepare(evals) if evals else None)


def generate_once(d: DataConfig) -> None:
    """Writes data.generate's dataset unless data.train exists. Every process of a launch gets
    here, on one node or several sharing a disk: the first takes a file lock and writes, the
    others wait on it and then find the file (without the lock one process read the train file
    while another was writing it: "no records")."""
    out = Path(d.train).parent
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".mmrl-generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not Path(d.train).exists():
            synthetic.GENERATORS.get(d.generate)(out, **d.generate_kwargs)


def prepare_samples(samples: Sequence[Sample], cfg: RunConfig,
                    image_factor: int) -> Sequence[Sample]:
    """`samples` with the config's template, think mode and resized sizes (module docstring)."""
    d, seed = cfg.data, cfg.train.seed

    def prepare(sample: Sample) -> Sample:
        if d.prompt_template:
            sample = apply_template(sample, d.prompt_template)
        sample = think_mode(sample, d, seed)
        add_resized_sizes([sample], d.image_min_pixels, d.image_max_pixels, image_factor)
        return sample

    if isinstance(samples, LazySamples):
        convert = samples.convert
        samples.convert = lambda record, source, base: prepare(convert(record, source, base))
        return samples
    return [prepare(s) for s in samples]


def asks_nothink(sample_id: str, share: float, seed: int) -> bool:
    """Stable per-sample choice: True for about `share` of ids (crc32 of seed and id)."""
    return zlib.crc32(f"{seed}:{sample_id}".encode()) / 2**32 < share


def think_mode(sample: Sample, d: DataConfig, seed: int) -> Sample:
    """data.think_hybrid > 0 (TON, TempSamp-R1's hybrid CoT): append the think or no-think
    instruction to the sample's last user text and record what was asked in its `think_mode`
    field (for the think_format reward and the think shares). Off: the sample as it is."""
    if d.think_hybrid <= 0:
        return sample
    mode = "no_think" if asks_nothink(sample.id, d.think_hybrid, seed) else "think"
    text = d.nothink_instruction if mode == "no_think" else d.think_instruction
    messages = [dict(m) for m in sample.messages]
    user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if user is None:
        raise ValueError(f"{sample.source}: data.think_hybrid needs a user message")
    content = user["content"]
    if isinstance(content, str):
        user["content"] = f"{content}\n{text}"
    else:
        user["content"] = [*content, {"type": "text", "text": f"\n{text}"}]
    return dataclasses.replace(sample, messages=messages,
                               fields={**sample.fields, "think_mode": mode})


def media_loader(cfg: RunConfig, image_factor: int, stats: dict | None = None):
    """`sample -> {"images", "videos", "audios"}` with the config's decode settings and cache."""
    from mmrl.data.cache import MediaCache

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
                 "factor": image_factor}
    return functools.partial(load_media, video_kwargs=video, audio_kwargs=audio, cache=cache,
                             stats=stats, image_kwargs=image)
