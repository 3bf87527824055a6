"""Measured peak memory of real training steps, to check the memory model (plan.py) against.

    measure(config_path, overrides, steps=2) -> {"peak_bytes", "device", "baseline_bytes", ...}

Each measurement runs in a fresh process (a process that already trained keeps freed memory
around). On CUDA the peak is `torch.cuda.max_memory_allocated` above what was allocated before
the Trainer was built; on CPU it is the peak resident set of this process's own memory (VmHWM,
reset at that point) above the resident set there, with glibc told to serve every allocation of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_), so
that freed tensors leave the resident set at once and it tracks live tensors. Not ru_maxrss: Linux
carries it across exec, so a child of a large process (a long pytest run) reports its parent's
peak.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from mmrl.bench.common import peak_rss_bytes, reset_peak_rss, rss_bytes

MARK = "MMRL_PEAK "


def measure(config_path: str | None, overrides: list[str], *, steps: int = 2,
            threads: int | None = None, timeout: float = 900) -> dict:
    spec = {"config": config_path, "overrides": list(overrides), "steps": steps,
            "threads": threads}
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "mmrl.bench.peak", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    line = next((l for l in proc.stdout.splitlines() if l.startswith(MARK)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"peak measurement failed (rc {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return json.loads(line[len(MARK):])


def _child(spec: dict) -> dict:
    import torch

    from mmrl.config import load
    from mmrl.train.loop import Trainer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(True)
    cfg = load(spec["config"], spec["overrides"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:  # the resident set also grows by imports and one-time setup: pay those first
        _warm_up(spec, cfg)
        base = rss_bytes()
        reset_peak_rss()
    start = time.perf_counter()
    trainer = Trainer(cfg)
    trainer.policy.fix_reference()
    prompts = _watch_prompts(trainer)
    stages, sampler = [], []
    for _ in range(spec["steps"]):
        metrics = trainer.train_step()
        stages.append({k[len("time/"):]: v for k, v in metrics.items() if k.startswith("time/")})
        sampler.append({k: v for k, v in metrics.items() if k.startswith("async/")})
    seconds = time.perf_counter() - start
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_rss_bytes() - base
    trainer.close()
    return {"peak_bytes": peak, "baseline_bytes": base, "device": "cuda" if cuda else "cpu",
            "seconds": seconds, "stages": stages, "async": sampler, "prompt_tokens": max(prompts["tokens"]),
            "vision_tokens": max(prompts["vision"]), "audio_tokens": max(prompts["audio"])}


def _watch_prompts(trainer) -> dict:
    """Record the length and media tokens of every prompt the run draws (what the memory model
    must be told about the data)."""
    seen = {"tokens": [0], "vision": [0], "audio": [0]}
    draw = trainer.prompts.next
    codec = trainer.policy.codec

    def next_(n):
        out = draw(n)
        for p in out:
            ids = p.tensors["input_ids"].reshape(1, -1)
            seen["tokens"].append(ids.shape[1])
            types = codec.adapter.token_type_ids(codec.processor, ids)
            seen["vision"].append(int(((types == 1) | (types == 2)).sum()))
            seen["audio"].append(int((types == 3).sum()))
        return out
    trainer.prompts.next = next_
    return seen


def _warm_up(spec: dict, cfg) -> None:
    """One step of the same run with the default tiny model, thrown away: every module the run
    imports and every one-time initialisation (thread pools, kernels) happen before the
    baseline, so the peak above it is tensors."""
    import gc
    from pathlib import Path

    from mmrl.config import load
    from mmrl.models.source import Tiny, parse
    from mmrl.train.loop import Trainer

    if not isinstance(parse(cfg.model.path), Tiny):
        raise ValueError("CPU peak measurement runs tiny models (model.path=tiny); real shapes "
                         "are measured on CUDA")
    warm = load(spec["config"], spec["overrides"] + [
        "model.tiny={}", "train.micro_batch_size=1",
        f"log.run_dir={Path(cfg.run_dir).parent / (Path(cfg.run_dir).name + '_warmup')}"])
    trainer = Trainer(warm)
    trainer.policy.fix_reference()
    trainer.train_step()
    trainer.close()
    del trainer
    gc.collect()


if __name__ == "__main__":
    print(MARK + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
