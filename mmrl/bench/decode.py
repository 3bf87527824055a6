"""Decode benchmark: eager vs compiled HF decode (mmrl.models.compiled_decode) in one process.

Both run mmrl's decode loop (`generate_shared`: one prefill, G rows decoded from it, the same
sampling code); only each token's forward differs: the eager model forward on a growing
dynamic cache, or one torch.compile'd text-decoder step on a static cache. Timed: the decode
seconds `generate_shared` reports (the prefill apart), interleaved trials, medians; the compile
(the first compiled call of each shape) is timed on its own and reported, never hidden in a
median. Greedy tokens of the two must be identical (checked, reported)."""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from mmrl.bench.common import prompt_of_length, tiny_vl

# eager and compiled: mmrl's decode loop, the token step eager or compiled (the compile's own
# effect); hf_generate: HF's generate, the HF engine's default path (its decode, prefill apart).
MODES = ("eager", "compiled", "hf_generate")


def bench_decode(*, family: str = "qwen2_5_vl", prompt_tokens: int = 256, group: int = 8,
                 completion_tokens: int = 64, trials: int = 5, model_bundle=None,
                 backend: str | None = None, mode: str | None = None) -> dict:
    """Eager vs compiled decode tokens/s on one prompt (`backend`/`mode`: torch.compile's; the
    GPU check passes mode="reduce-overhead", its CPU dry run backend="eager")."""
    from mmrl.models.compiled_decode import CompiledDecoder
    from mmrl.models.forward import generate
    from mmrl.models.shared_generate import generate_shared
    from mmrl.train.speed import copy_bandwidth, decode_weight_bytes
    from mmrl.types import SamplingParams

    codec, model = model_bundle or tiny_vl(family)
    model.eval()
    prompts = [prompt_of_length(codec, prompt_tokens)]
    suppress = codec.placeholder_ids
    # EOS = a suppressed placeholder, never sampled: every row decodes the full budget.
    sampling = SamplingParams(num_generations=group, max_new_tokens=completion_tokens,
                              suppress_ids=suppress, seed=0, eos_ids=[suppress[0]],
                              do_sample=False)
    decoder = CompiledDecoder(model, backend=backend, mode=mode)

    # HF's greedy generate takes one sequence per prompt: the prompt repeated G times instead.
    hf_sampling = dataclasses.replace(sampling, num_generations=1)
    runners = {
        "eager": lambda stats: generate_shared(model, codec.processor, prompts, sampling, stats=stats),
        "compiled": lambda stats: generate_shared(model, codec.processor, prompts, sampling,
                                                  stats=stats, decoder=decoder),
        "hf_generate": lambda stats: generate(model, codec.processor, prompts * group, hf_sampling,
                                              stats=stats)}

    def run(which: str) -> tuple[dict, torch.Tensor]:
        stats: dict = {}
        return stats, runners[which](stats).completion_ids

    started = time.perf_counter()
    _, compiled_ids = run("compiled")  # the compile: timed by the decoder
    compile_wall = time.perf_counter() - started
    _, eager_ids = run("eager")
    _, hf_ids = run(MODES[2])
    seconds: dict = {m: [] for m in MODES}
    cpu: dict = {m: [] for m in MODES}
    last: dict = {}
    for t in range(trials):
        for which in (MODES if t % 2 == 0 else MODES[::-1]):
            stats, _ = run(which)
            seconds[which].append(stats["decode_s"])
            cpu[which].append(stats["decode_cpu_s"])
            last[which] = stats
    forwards = last["eager"]["decode_forwards"]
    rows = group * len(prompts)
    weights = decode_weight_bytes(model)
    peak = copy_bandwidth(next(model.parameters()).device)
    out = {"family": family, "prompt_tokens": prompts[0].input_ids.shape[0], "group": group,
           "completion_tokens": completion_tokens, "trials": trials, "decode_forwards": forwards,
           "greedy_identical": bool(torch.equal(compiled_ids, eager_ids)
                                    and torch.equal(compiled_ids, hf_ids)),
           "compile_s": decoder.stats()["decode/compile_s"], "first_call_s": compile_wall,
           "compiles": decoder.stats()["decode/compiles"],
           "recompiles": decoder.stats()["decode/recompiles"],
           "weight_bytes": weights, "peak_bytes_per_s": peak}
    for which in MODES:
        median = statistics.median(seconds[which])
        read = weights * forwards + last[which]["kv_read_bytes"]
        out[which] = {"trials_s": seconds[which], "median_s": median,
                      "median_cpu_s": statistics.median(cpu[which]),
                      "tokens_per_s": rows * forwards / median,
                      "bytes_per_s": read / median, "bandwidth_share": read / median / peak}
    out["speedup"] = out["compiled"]["tokens_per_s"] / out["eager"]["tokens_per_s"]
    out["speedup_cpu"] = out["eager"]["median_cpu_s"] / out["compiled"]["median_cpu_s"]
    out["speedup_min"] = min(seconds["eager"]) / min(seconds["compiled"])
    hf = out[MODES[2]]
    out["speedup_vs_hf_generate"] = out["compiled"]["tokens_per_s"] / hf["tokens_per_s"]
    out["speedup_vs_hf_generate_cpu"] = hf["median_cpu_s"] / out["compiled"]["median_cpu_s"]
    return out


def decode_table(r: dict) -> list[str]:
    lines = [f"{r['family']}, 1 prompt of {r['prompt_tokens']} tokens, G = {r['group']} rows "
             f"decoded from one prefill, {r['completion_tokens']} new tokens (greedy, EOS never "
             f"chosen), {r['trials']} interleaved trials; decode seconds only (prefill apart). "
             f"Bytes read per step: weights ({r['weight_bytes'] / 2**20:.1f} MiB) + KV; peak "
             f"{r['peak_bytes_per_s'] / 1e9:.1f} GB/s (a GPU's datasheet figure, on CPU a "
             f"measured copy bandwidth).", "",
             "| decode | median s | median CPU s | new tokens/s | achieved GB/s | share of peak "
             "| trials (s) |", "|---|---:|---:|---:|---:|---:|---|"]
    for mode in MODES:
        m = r[mode]
        lines.append(f"| {mode} | {m['median_s']:.3f} | {m['median_cpu_s']:.3f} | "
                     f"{m['tokens_per_s']:,.0f} | "
                     f"{m['bytes_per_s'] / 1e9:.2f} | {100 * m['bandwidth_share']:.1f}% | "
                     + ", ".join(f"{s:.3f}" for s in m["trials_s"]) + " |")
    lines += ["", f"**Compiled / eager decode tokens/s: {r['speedup']:.2f}x** (median wall; "
              f"min wall {r['speedup_min']:.2f}x, median CPU {r['speedup_cpu']:.2f}x); over HF "
              f"generate's decode: {r['speedup_vs_hf_generate']:.2f}x (median CPU "
              f"{r['speedup_vs_hf_generate_cpu']:.2f}x); greedy tokens of all three "
              f"identical: {'yes' if r['greedy_identical'] else 'NO'}; compile: {r['compiles']} "
              f"shape(s) in {r['compile_s']:.1f} s (first compiled call {r['first_call_s']:.1f} s), "
              f"{r['recompiles']} unexpected recompiles."]
    return lines
