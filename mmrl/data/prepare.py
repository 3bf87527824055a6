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
from mmrl.data.prompts import apply_template, last_user
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
    # data.format is the config's: it reads the file, or detection does (mmrl/data/detect.py).
    train = load_samples(d.train, None, d.max_samples, configured=d.format,
                         default_split="train")
    evals = (load_samples(d.eval, None, cfg.eval.max_samples, configured=d.format)
             if d.eval else None)
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
    messages, user = last_user(sample, "data.think_hybrid")
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


# ------------------------------------------------------------------------- start checks ----
def check_datasets(cfg: RunConfig, train: Sequence[Sample], evals: Sequence[Sample] | None,
                   media_kinds: tuple[str, ...] = ()) -> list[str]:
    """What `mmrl train` checks at its start, and `mmrl data inspect --config` on a file, so an
    inspect that passes means training loads. Raises ValueError where the run would learn or
    measure nothing: a reward that can score none of its records, an eval set the main metric
    cannot score, training records that carry none of the media the model family reads
    (`media_kinds`: its adapter's; the run would train text-only). Returns warnings: how a file was read (a configured format that did not fit),
    records whose prompt holds their own answer. Checked on a spread of the records
    (mmrl/data/inspect.py `spread`)."""
    from mmrl.data.chat import answer_in_prompt
    from mmrl.data.inspect import check_scorable, spread

    warnings = [*getattr(train, "notes", []), *getattr(evals, "notes", [])]
    check_scorable(cfg.rewards, train, cfg.rollout.max_new_tokens)
    if evals:
        check_metric(cfg, evals)
    picked = spread(train)
    check_media_present(picked, media_kinds, cfg.model.family)
    leaked = [s for s in picked if answer_in_prompt(s.messages, s.solution)]
    if leaked:
        first = leaked[0]
        warnings.append(f"{len(leaked)} of {len(picked)} records checked hold their own answer in "
                        f"the prompt (first: {first.source}, answer {first.solution!r:.40}): the "
                        f"model would read it there. Remove it from the prompt, or keep the "
                        f"answer only as the chat's last assistant turn or the 'solution' field")
    return warnings


def check_media_present(picked: list[Sample], media_kinds: tuple[str, ...], family: str) -> None:
    """Stop when a media model's training records carry no media at all: every step would train
    the model text-only, which is never what a multimodal recipe means; and when a record carries
    a kind of media the family cannot read (it would be dropped, or fail at its first draw)."""
    alien = [(s, k) for s in picked for k in ("images", "videos", "audios")
             if media_kinds and k not in media_kinds and getattr(s, k, None)]
    if alien:
        s, kind = alien[0]
        raise ValueError(f"{s.source}: the record carries {kind}, which the model family {family} "
                         f"does not read (it reads {' and '.join(media_kinds)}); "
                         f"{len(alien)} of the {len(picked)} records checked do. Remove them, or "
                         f"train a family that reads {kind} (docs/models.md)")
    if not media_kinds or not picked or any(getattr(s, k) for s in picked for k in media_kinds):
        return
    keys = sorted({k for s in picked for k in s.fields})[:12]
    raise ValueError(f"none of the {len(picked)} training records checked carry "
                     f"{' or '.join(media_kinds)}, which the model family {family} reads: the run would train text-only "
                     f"(first record: {picked[0].source}; its other fields: {keys}). Give each "
                     f"record its media ('images' / 'videos' / 'audios', docs/data.md \"Media in "
                     f"a record\")")


def check_metric(cfg: RunConfig, evals: Sequence[Sample]) -> None:
    """Stop when eval.metric_reward can score no eval record: it is routed to none of their
    tasks, or returns None for their gold answers (accuracy_after_rl would be NaN)."""
    from mmrl.config import RewardSpec
    from mmrl.data.inspect import reward_scorability, spread

    name = cfg.eval.metric_reward
    specs = [s for s in cfg.rewards if s.name == name] or [RewardSpec(name=name)]
    picked = spread(evals)
    empty = [s for s in picked if s.solution is None or s.solution == [] or
             (isinstance(s.solution, str) and not s.solution.strip())]
    if empty:  # scored as wrong (or None: a NaN accuracy), never measured
        raise ValueError(f"{len(empty)} of the {len(picked)} eval records checked have an empty "
                         f"solution (first: {empty[0].source}): {name} cannot score them, so "
                         f"the eval accuracy would be wrong. Fill in their solutions or drop "
                         f"those records")
    rows = reward_scorability(specs, picked, cfg.rollout.max_new_tokens)
    if any(r["scorable"] for r in rows):
        return
    tasks = sorted({s.task for s in picked})
    routes = sorted({t for s in specs for t in (s.tasks or [])})
    first = picked[0]
    if not any(r["of"] for r in rows):
        why = (f"it is routed to tasks {routes} (rewards[].tasks) and the eval records' tasks are "
               f"{tasks}")
    else:
        why = f"it returns None for their gold answers (first answer {first.solution!r:.40})"
    raise ValueError(f"eval.metric_reward {name!r} can score none of the {len(picked)} eval "
                     f"records checked: {why} (first record: {first.source}, task "
                     f"{first.task!r}); accuracy would be NaN. Route a {name} reward to those "
                     f"tasks, or set eval.metric_reward to a reward that scores them")
