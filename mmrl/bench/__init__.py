"""`mmrl bench`: how much faster the shared-prefix layout makes a multimodal GRPO step.

    run_benchmarks(out_dir, which=("update", "scaling"))  ->  results dict; writes
    out_dir/bench.json, out_dir/bench.md and out_dir/scaling.png

1 "update":  update phase (old + ref logprobs, loss, backward), naive vs shared, tiny
             Qwen2.5-VL, G = 8, prompt ~1024 tokens (mostly image), completions 64 tokens.
2 "e2e":     a whole training step of mmrl vs TRL's GRPOTrainer (needs the `bench` extra).
3 "scaling": update-phase time as P grows (256 .. 2048) and as G grows (4, 8, 16).
  "rollout": HF generate (G prefills) vs prefill-once, whole group and in rounds (G = 16).
  "decode":  eager vs compiled decode tokens/s (static KV cache + torch.compile, one prefill,
             G = 8), achieved bytes/s against a measured copy bandwidth, compile seconds.
  "varlen":  naive vs dense-mask vs varlen-kernel layouts at the cells issue #14 targets
             (P~1024 G=8, ragged, G=16; P~2048 G=16), peak memory beside time.
  "runs":    pack sizes under a dense mask: naive / whole groups / the trainer's runs / varlen,
             at a tool row's shape (short prompt, long trajectories) and issue #14's
  "long":    long videos: sequence parallelism SP=1 vs SP=2 (memory per rank, time) at 16, 64
             and 256 frames; row-count vs token-budget micro-batches on a mixed batch; a frozen
             encoder cached vs not (mmrl/bench/long.py).
  "async":   the quickstart whole, rollout.max_staleness 0 vs 1: RL steps/s and the learning
             against the learning table's bar (mmrl/bench/async_bench.py; minutes).

Every comparison runs both sides in one process with interleaved repeated trials and reports
medians: the ratio is what to read; absolute seconds depend on the machine and its load.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

BENCHMARKS = ("update", "e2e", "rollout", "decode", "scaling", "varlen", "runs", "long",
              "async")


def run_benchmarks(out_dir: str | Path, which=BENCHMARKS, *, quick: bool = False,
                   trials: int | None = None, threads: int | None = None,
                   family: str = "qwen2_5_vl", log=print) -> dict:
    """Run the chosen benchmarks and write bench.json, bench.md (and scaling.png) to out_dir.

    `quick`: tiny sizes and one trial (a smoke run for tests, not numbers to report).
    `trials`: repeated trials per configuration (default 5 for update/e2e, 3 for scaling).
    `threads`: torch intra-op threads (default: leave as set).
    """
    import torch

    from mmrl.bench import report
    from mmrl.bench.common import machine, threads as use_threads, tiny_vl

    unknown = set(which) - set(BENCHMARKS)
    if unknown:
        raise ValueError(f"unknown benchmark(s) {sorted(unknown)}; choose from {BENCHMARKS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_flush_denormal(True)  # denormals caused 10-20x spikes in tiny-model training
    results: dict = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv else "",
                     "which": list(which), "quick": quick, "load_average": list(os.getloadavg())}
    started = time.time()
    with use_threads(threads):
        results["machine"] = machine()
        sizes = _sizes(quick)
        bundle = tiny_vl(family, max_image_tokens=max(sizes["prompt_sizes"]) * 2)
        if "update" in which:
            from mmrl.bench.update import bench_update

            log(f"[bench] update phase: P={sizes['prompt']} G={sizes['group']} C={sizes['completion']}")
            results["update"] = bench_update(
                family=family, prompt_tokens=sizes["prompt"], group=sizes["group"],
                completion_tokens=sizes["completion"], trials=trials or sizes["trials"],
                model_bundle=bundle, memory=not quick)
            log(f"[bench] update: x{results['update']['speedup']:.2f}")
        if "e2e" in which:
            from mmrl.bench.e2e import bench_e2e

            try:
                import trl  # noqa: F401
            except ImportError:
                log("[bench] e2e skipped: TRL is not installed (pip install 'mmrl[bench]')")
            else:
                log("[bench] end-to-end step: mmrl vs TRL")
                results["e2e"] = bench_e2e(quick=quick, trials=trials, log=log)
                log(f"[bench] e2e: mmrl x{results['e2e']['speedup']:.2f} vs TRL")
        if "rollout" in which:
            from mmrl.bench.rollout import bench_rollout

            log("[bench] rollout: HF generate vs prefill once (+ rounds)")
            results["rollout"] = bench_rollout(
                family=family, prompt_tokens=sizes["prompt"], group=sizes["rollout_group"],
                completion_tokens=sizes["completion"], rounds_of=sizes["rounds_of"],
                trials=trials or sizes["scaling_trials"], model_bundle=bundle, memory=not quick)
            log(f"[bench] rollout: x{results['rollout']['speedup_shared']:.2f}")
        if "decode" in which:
            from mmrl.bench.decode import bench_decode

            log("[bench] decode: eager vs compiled (static cache + torch.compile)")
            results["decode"] = bench_decode(
                family=family, prompt_tokens=sizes["decode_prompt"], group=sizes["group"],
                completion_tokens=sizes["completion"], trials=trials or sizes["trials"],
                model_bundle=bundle)
            log(f"[bench] decode: compiled x{results['decode']['speedup']:.2f} "
                f"(compile {results['decode']['compile_s']:.0f} s)")
        if "scaling" in which:
            from mmrl.bench.update import bench_scaling

            log("[bench] scaling")
            results["scaling"] = bench_scaling(
                family=family, prompt_sizes=sizes["prompt_sizes"], groups=sizes["groups"],
                base_prompt=sizes["prompt"], base_group=sizes["group"],
                completion_tokens=sizes["completion"],
                trials=trials or sizes["scaling_trials"], model_bundle=bundle, memory=not quick,
                log=log)
            results["plot"] = report.plot_scaling(results["scaling"], out / "scaling.png").name
        if "varlen" in which:
            from mmrl.bench.kernels import CELLS, QUICK_CELLS, bench_kernels

            log("[bench] varlen kernel: naive / dense mask / varlen")
            results["varlen"] = bench_kernels(
                family=family, cells=QUICK_CELLS if quick else CELLS,
                completion_tokens=sizes["completion"], trials=trials or sizes["scaling_trials"],
                model_bundle=bundle, memory=not quick, log=log)
        if "runs" in which:
            from mmrl.bench.runs import CELLS as RUN_CELLS, QUICK_CELLS as QUICK_RUNS, bench_runs

            log("[bench] pack sizes: naive / whole / runs / varlen")
            results["runs"] = bench_runs(family=family, cells=QUICK_RUNS if quick else RUN_CELLS,
                                         trials=trials or sizes["scaling_trials"],
                                         model_bundle=bundle, log=log)
        if "long" in which:
            from mmrl.bench.long import bench_long

            results["long"] = bench_long(quick=quick, trials=trials, log=log)
        if "async" in which:
            from mmrl.bench.async_bench import bench_async

            results["async"] = bench_async(out, quick=quick, log=log)
            log(f"[bench] async: k=1 x{results['async']['speedup']:.2f} RL steps/s over k=0")
    results["load_average_end"] = list(os.getloadavg())
    results["seconds"] = time.time() - started
    for line in report.headline(results):  # #54's ratios, side by side, from this one run
        log(f"[bench] {line}")
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    (out / "bench.md").write_text(report.markdown(results))
    log(f"[bench] wrote {out / 'bench.json'} and {out / 'bench.md'} in {results['seconds']:.0f} s")
    return results


def _sizes(quick: bool) -> dict:
    if quick:
        return dict(prompt=64, group=2, completion=8, prompt_sizes=(32, 64), groups=(2, 3),
                    trials=1, scaling_trials=1, rollout_group=4, rounds_of=2, decode_prompt=64)
    return dict(prompt=1024, group=8, completion=64, prompt_sizes=(256, 512, 1024, 2048),
                groups=(4, 8, 16), trials=5, scaling_trials=3, rollout_group=16, rounds_of=4,
                decode_prompt=256)


__all__ = ["BENCHMARKS", "run_benchmarks"]
