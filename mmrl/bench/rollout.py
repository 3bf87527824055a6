"""Rollout benchmark: HF `generate` with G prefills (forward.generate) vs prefill-once
`generate_shared`, whole group and in rounds of g (micro-sampling): time per call (interleaved
trials, medians), KV-cache peak and peak RSS growth (each mode in a fresh process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from mmrl.bench.common import interleaved, prompt_of_length, tiny_vl

MODES = ("hf_generate", "shared", "shared_rounds")


def _generate(mode: str, model, processor, prompts, *, group: int, completion_tokens: int,
              rounds_of: int, suppress, stats: dict | None = None):
    from mmrl.models.forward import generate
    from mmrl.models.shared_generate import generate_shared
    from mmrl.types import SamplingParams

    # EOS = a suppressed placeholder, never sampled: every row decodes the full budget.
    sampling = SamplingParams(num_generations=group, max_new_tokens=completion_tokens,
                              suppress_ids=suppress, seed=0, eos_ids=[suppress[0]])
    if mode == "hf_generate":
        return generate(model, processor, prompts, sampling)
    return generate_shared(model, processor, prompts, sampling, stats=stats,
                           rounds_of=rounds_of if mode == "shared_rounds" else None)


def bench_rollout(*, family: str = "qwen2_5_vl", prompt_tokens: int = 1024, group: int = 16,
                  completion_tokens: int = 64, rounds_of: int = 4, trials: int = 3,
                  model_bundle=None, memory: bool = True) -> dict:
    codec, model = model_bundle or tiny_vl(family)
    prompts = [prompt_of_length(codec, prompt_tokens)]
    suppress = codec.placeholder_ids
    kw = dict(group=group, completion_tokens=completion_tokens, rounds_of=rounds_of, suppress=suppress)
    timings = interleaved({m: (lambda m=m: _generate(m, model, codec.processor, prompts, **kw)) for m in MODES},
                          trials, warmup=1)
    cache = {}
    for mode in MODES[1:]:
        stats: dict = {}
        _generate(mode, model, codec.processor, prompts, stats=stats, **kw)
        cache[mode] = stats["peak_cache_bytes"] / 2**20
    out = {"family": family, "prompt_tokens": prompts[0].input_ids.shape[0], "group": group,
           "completion_tokens": completion_tokens, "rounds_of": rounds_of, "trials": trials,
           **{m: timings[m].as_dict() for m in MODES}, "kv_cache_peak_mb": cache,
           "speedup_shared": timings["hf_generate"].median / timings["shared"].median,
           "speedup_rounds": timings["hf_generate"].median / timings["shared_rounds"].median}
    if memory:
        out["memory_mb"] = {m: _measure_memory(m, family, prompt_tokens, kw) for m in MODES}
    return out


def _measure_memory(mode: str, family: str, prompt_tokens: int, kw: dict) -> float:
    spec = dict(mode=mode, family=family, prompt_tokens=prompt_tokens, threads=torch.get_num_threads(),
                **{k: v for k, v in kw.items() if k != "suppress"})
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "mmrl.bench.rollout", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH_MEMORY ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"rollout memory measurement failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(line.split()[1])


def _memory_main(spec_json: str) -> None:
    from mmrl.bench.common import PeakRSS

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(True)
    codec, model = tiny_vl(spec["family"], max_image_tokens=max(4096, spec["prompt_tokens"] * 2))
    prompts = [prompt_of_length(codec, spec["prompt_tokens"])]
    with PeakRSS() as mem:
        _generate(spec["mode"], model, codec.processor, prompts, group=spec["group"],
                  completion_tokens=spec["completion_tokens"], rounds_of=spec["rounds_of"],
                  suppress=codec.placeholder_ids)
    print(f"BENCH_MEMORY {mem.extra / 2**20:.1f}", flush=True)


def rollout_table(r: dict) -> list[str]:
    labels = {"hf_generate": "HF generate, G prefills (forward.generate)",
              "shared": "prefill once, G decoded from the shared cache",
              "shared_rounds": f"prefill once, rounds of {r['rounds_of']}"}
    mem = r.get("memory_mb", {})
    lines = [
        "### Rollout: prefill once and micro-sampling",
        "",
        f"Tiny {r['family']}, 1 prompt of {r['prompt_tokens']} tokens, G = {r['group']}, "
        f"{r['completion_tokens']} new tokens per row (no EOS), {r['trials']} interleaved trials.",
        "",
        "| mode | median s | min s | KV cache peak (MB) | peak RSS growth (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        kv = r["kv_cache_peak_mb"].get(mode)
        lines.append(f"| {labels[mode]} | {r[mode]['median_s']:.2f} | {r[mode]['min_s']:.2f} | "
                     f"{'-' if kv is None else f'{kv:.1f}'} | {mem.get(mode, float('nan')):.0f} |")
    lines += ["", f"Prefill once: {r['speedup_shared']:.2f}x faster than HF generate; rounds of "
                  f"{r['rounds_of']}: {r['speedup_rounds']:.2f}x."]
    return lines


if __name__ == "__main__":
    _memory_main(sys.argv[1])
