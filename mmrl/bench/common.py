"""Benchmark plumbing: tiny models and synthetic groups of a chosen prompt length, timing with
interleaved repeated trials (medians), peak-RSS sampling, machine description.

Why interleaved trials: the benchmark machine is shared (2 cores here); running layout A's
trials and then layout B's would charge any background load to one side. Alternating A, B, A,
B ... and taking medians gives ratios that hold within one run.
"""
from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mmrl.models.codec import Codec

# Text tokens around the image in the benchmark prompt (chat template + question): the image
# gets the rest of the prompt length.
QUESTION = "How many red squares are in the picture? Answer with <answer>N</answer>."


def machine() -> dict:
    """What the numbers were measured on."""
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count()}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:  # pragma: no cover
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        info["memory_gb"] = round(kb / 2**20, 1)
    except (OSError, StopIteration):  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def reset_peak_rss() -> None:
    """Start this process's resident-set high-water mark (VmHWM) afresh at its current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    """This process's own peak resident set (VmHWM). Not ru_maxrss: Linux carries that across
    exec, so a benchmark child of a large process (a long pytest run) would report its parent's
    peak."""
    with open("/proc/self/status") as f:
        line = next(l for l in f if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # kB


class PeakRSS:
    """Samples RSS in a thread every `interval` s; `.peak` is the max seen, `.extra` the max
    above the RSS at entry. torch ops release the GIL, so the sampler runs during them."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.peak, self.base = interval, 0, 0
        self._stop = threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.base


class PeakAllocated:
    """Peak growth of the tensor memory torch's CPU allocator holds while inside (what a GPU's
    `max_memory_allocated` reports), from the profiler's allocation record: unlike RSS, memory
    that the C allocator keeps after a free does not count. Slows what runs inside: measure
    memory and time in separate runs."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        import json
        import tempfile

        self._prof.__exit__(*exc)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
        self.extra = max([0, *totals])


@contextmanager
def threads(n: int | None):
    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass
class Timing:
    times: list[float]  # wall seconds per trial
    cpu_times: list[float]  # process CPU seconds per trial (all threads)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def as_dict(self) -> dict:
        return {"median_s": self.median, "min_s": min(self.times), "times_s": self.times,
                "median_cpu_s": statistics.median(self.cpu_times), "cpu_times_s": self.cpu_times}


def interleaved(fns: dict, trials: int, warmup: int = 1) -> dict[str, Timing]:
    """Run every fn `warmup` times, then `trials` rounds of all fns in alternating order
    (A B, B A, ...); wall and CPU seconds per trial of each fn."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    names = list(fns)
    for t in range(trials):
        for name in (names if t % 2 == 0 else names[::-1]):
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {k: Timing(wall[k], cpu[k]) for k in fns}


def tiny_vl(family: str = "qwen2_5_vl", seed: int = 0, max_image_tokens: int = 4096):
    """The tiny offline model the unit tests use (hidden 128, 4 layers, vision depth 2), with an
    image budget large enough for the longest benchmark prompt."""
    from mmrl.models import get_adapter
    from mmrl.models.codec import Codec

    adapter = get_adapter(family)
    model, processor = adapter.tiny(seed=seed, min_pixels=28 * 28 * 4,
                                    max_pixels=28 * 28 * max_image_tokens)
    return Codec(adapter, processor), model


def image_grid(n_tokens: int) -> tuple[int, int]:
    """(rows, cols) of merged image tokens, rows * cols <= n_tokens, near square."""
    rows = max(1, int(n_tokens ** 0.5))
    return rows, max(1, n_tokens // rows)


def prompt_of_length(codec: Codec, prompt_tokens: int, seed: int = 0):
    """PromptFeatures of one image + a question, about `prompt_tokens` tokens long, nearly all
    of them image tokens (a 28 px cell per merged token)."""
    import numpy as np
    from PIL import Image

    from mmrl.types import Sample

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    sample = Sample(id=f"bench-{prompt_tokens}-{seed}", messages=messages)
    probe = codec.prompt_features(sample, [Image.new("RGB", (56, 56))])
    text_tokens = probe.input_ids.shape[0] - 4  # a 56x56 image is 4 tokens
    rows, cols = image_grid(max(4, prompt_tokens - text_tokens))
    pixels = np.random.RandomState(seed).randint(0, 255, (rows * 28, cols * 28, 3)).astype(np.uint8)
    return codec.prompt_features(sample, [Image.fromarray(pixels)])


def random_completions(n: int, length: int, pad_id: int, seed: int = 0, vocab: int = 700,
                       uneven: bool = False):
    """[n, length] token ids below `vocab` (plain BPE ids in the tiny tokenizer: no media
    placeholders) and the mask; `uneven` draws lengths in [length/2, length]."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=gen)
    if uneven:
        lengths = torch.randint(length // 2, length + 1, (n,), generator=gen)
    else:
        lengths = torch.full((n,), length)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask
