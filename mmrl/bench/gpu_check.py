"""The GPU check (scripts/gpu_check.sh): numbers at real size in one command, written as
docs/gpu.md. `--cpu` runs every stage at tiny sizes on the CPU, so that the script cannot rot
between the rare times a GPU is lent.

    python -m mmrl.bench.gpu_check --out DIR [--cpu] [--budget-s 460]

Stages, each timed and fenced (a failing stage is reported with its error, the others go on;
stages that would run past the time budget are skipped and say so):
  environment   GPU, torch, transformers, attention kernels present, a bf16 matmul rate
  correctness   shared-prefix vs naive layout, logprobs and gradients, per kernel, bf16
  update        naive / shared / varlen update phase, image P~1024 and video P~4096, G 8 and 16
  generation    HF generate vs prefill once
  decode        eager vs compiled decode (static KV cache + torch.compile, CUDA graphs):
                tokens/s and % of the bandwidth floor (weights + KV read per step)
  grpo step     one real GRPO step (mmrl's Trainer) of a Qwen2.5-VL-3B-shaped model, against
                the memory model's prediction
  async step    the same step with rollout.max_staleness 0 vs 1 (docs/async.md): steps/s, ratio
  trl           the same step through TRL's GRPOTrainer, where TRL imports
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from mmrl.bench import gpu_stages as stages

# Bf16 dense peaks from the datasheets (SXM parts), for MFU; other devices use the measured rate.
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1}
STEP_SHAPE = "qwen2_5_vl-3b"
STAGES = ("environment", "correctness", "update", "generation", "decode", "grpo step",
          "async step", "trl")
UPDATE_LAYERS = 8  # the update/generation stages run 8 of the 36 layers; seconds are scaled


def sizes(cpu: bool) -> dict:
    if cpu:
        return dict(update_cells=[("image", 64, 2), ("video", 128, 3)], completion=16,
                    micro_batch=4, trials=1, gen=dict(prompt_tokens=64, group=3, completion=8),
                    correct=dict(prompt_tokens=48, group=3, completion=8), step_image=112,
                    step=dict(group=3, completion=8, micro=4, prompts=2, steps=2))
    return dict(update_cells=[("image", 1024, 8), ("image", 1024, 16), ("video", 4096, 8),
                              ("video", 4096, 16)], completion=512, micro_batch=4, trials=2,
                gen=dict(prompt_tokens=1024, group=8, completion=256),
                correct=dict(prompt_tokens=256, group=4, completion=64), step_image=896,
                step=dict(group=8, completion=256, micro=4, prompts=2, steps=3))


def bundle(cpu: bool, layers: int | None, checkpointing: bool = False):
    """(codec, model): the tiny twin on CPU, the 3B shape on CUDA (bf16)."""
    from mmrl.models import get_adapter, shapes
    from mmrl.models.codec import Codec

    adapter = get_adapter("qwen2_5_vl")
    if cpu:
        model, processor = adapter.tiny(seed=0, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 512)
        return Codec(adapter, processor), model
    model, processor = shapes.build(STEP_SHAPE, layers, dtype=torch.bfloat16, device="cuda")
    model.set_attn_implementation("sdpa")
    if checkpointing:  # as the recipes train: the 4096-token video cells fit on one GPU
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return Codec(adapter, processor), model


def environment(cpu: bool) -> dict:
    import transformers

    from mmrl.models import prefix_attention

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else
           f"CPU ({platform.processor() or platform.machine()})",
           "varlen kernel": prefix_attention.kernel_description()}
    env["kernels"] = {"sdpa": "yes", "flex_attention": _flex(), "flash-attn": _flash()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["memory_gib"] = props.total_memory / 2 ** 30
        env["matmul_tflops"] = _matmul_rate()
        name = env["device"]
        env["peak_tflops"] = next((v for k, v in PEAK_TFLOPS.items() if k in name),
                                  env["matmul_tflops"])
    return env


def _flex() -> str:
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as e:
        return f"no ({e})"
    if not torch.cuda.is_available():
        return "importable (compiles only on CUDA here)"
    try:
        q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
        torch.compile(flex_attention)(q, q, q)
        return "yes (compiled)"
    except Exception as e:  # triton missing, compile error
        return f"importable, compile failed: {type(e).__name__}: {str(e)[:100]}"


def _flash() -> str:
    try:
        import flash_attn
        return f"yes ({flash_attn.__version__})"
    except ImportError:
        return "no"


def _matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    seconds, _ = stages.timed(lambda: a @ a, trials=10, warmup=3)
    return 2 * 8192 ** 3 / seconds / 1e12


def decode_stage(cpu: bool, part, s: dict) -> dict:
    """Eager vs compiled decode at the generation stage's sizes (bench/decode.py): CUDA graphs
    on the GPU; the CPU dry run compiles with dynamo's eager backend (no inductor: seconds, not
    minutes), which exercises the path, not its speed."""
    from mmrl.bench.decode import bench_decode

    g = s["gen"]
    return bench_decode(prompt_tokens=g["prompt_tokens"], group=g["group"],
                        completion_tokens=g["completion"], trials=max(s["trials"], 2),
                        model_bundle=part, backend="eager" if cpu else None,
                        mode=None if cpu else "reduce-overhead")


def step_overrides(cpu: bool, s: dict, workdir: Path) -> list[str]:
    """The GRPO step's config (the step shape; the tiny twin, widened, with --cpu)."""
    st = s["step"]
    path = "tiny" if cpu else f"shape:{STEP_SHAPE}"
    size = s["step_image"]
    overrides = [
        f"data.train={workdir}/data/train.jsonl", "data.format=mmrl", "data.generate=counting",
        f"data.generate_kwargs={{n_train: 8, n_eval: 2, size: {size}}}",
        f"data.image_max_pixels={size * size}", "model.family=qwen2_5_vl", f"model.path={path}",
        f"model.dtype={'float32' if cpu else 'bfloat16'}", "model.attn_implementation=sdpa",
        f"model.gradient_checkpointing={'false' if cpu else 'true'}",
        f"rollout.prompts_per_step={st['prompts']}", f"rollout.num_generations={st['group']}",
        f"rollout.max_new_tokens={st['completion']}", "algo.beta=0.04",
        f"train.micro_batch_size={st['micro']}", f"train.steps={st['steps']}",
        "train.save_every=0", "eval.before_rl=false", "log.tensorboard=false",
        "log.progress=off", "log.rollouts_every=0", f"log.run_dir={workdir}/run",
        "rewards=[{name: count}, {name: format, weight: 0.5}]"]
    if cpu:  # wide enough that tensors, not the interpreter, dominate the resident set
        overrides.append("model.tiny={hidden_size: 256, intermediate_size: 768, "
                         "num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, "
                         "vocab_size: 32768, max_pixels: %d}" % (s["step_image"] ** 2))
    return overrides


def grpo_step(cpu: bool, s: dict, workdir: Path, gpu_gib: float) -> dict:
    """One real GRPO step of the step shape (the tiny twin with --cpu), measured in a fresh
    process, beside the memory model's prediction for the same config."""
    from mmrl import plan
    from mmrl.bench import peak
    from mmrl.config import load

    st = s["step"]
    overrides = step_overrides(cpu, s, workdir)
    measured = peak.measure(None, overrides, steps=st["steps"])
    cfg = load(None, overrides)
    facts, what = plan.config_facts(cfg)
    workload, _ = plan.config_workload(cfg, facts, 1, media_tokens=measured["vision_tokens"],
                                       prompt_tokens=measured["prompt_tokens"])
    predicted = plan.predict(facts, workload, plan.Cluster(gpu_gib, 1, "ddp",
                                                           device="cpu" if cpu else "cuda"))
    later = measured["stages"][1:] or measured["stages"]  # the first step warms up
    keys = later[0].keys()
    med = {k: sorted(st_[k] for st_ in later)[len(later) // 2] for k in keys}
    return {"model": what, "overrides": overrides, "measured_peak": measured["peak_bytes"],
            "predicted_peak": predicted.peak, "predicted_phase": predicted.phase,
            "prompt_tokens": measured["prompt_tokens"], "stages": med,
            "steps_measured": len(later), "group": st["group"], "prompts": st["prompts"],
            "completion": st["completion"]}


def async_step(cpu: bool, s: dict, workdir: Path) -> dict:
    """The GRPO step's config run with rollout.max_staleness 0 and then 1 (docs/async.md), each
    in a fresh process (bench/peak.py's child: mmrl's Trainer, `train_step` in a loop), one
    step more than the step stage. Steps/s: the steps after the first over the sum of their
    wall times (`time/step`): the first step of k = 1 waits for the first batch, as k = 0's
    does, so both are read in the steady state."""
    from mmrl.bench import peak

    steps = s["step"]["steps"] + 1
    out: dict = {"steps": steps, "steps_timed": steps - 1}
    for k in (0, 1):
        overrides = [*step_overrides(cpu, s, workdir / f"k{k}"), f"train.steps={steps}",
                     f"rollout.max_staleness={k}"]
        measured = peak.measure(None, overrides, steps=steps)
        later = measured["stages"][1:]
        wall = sum(st_["step"] for st_ in later)
        out[f"k{k}"] = {"steps_per_s": len(later) / wall, "step_s": [st_["step"] for st_ in later],
                        "rollout_s": sum(st_.get("rollout", 0.0) for st_ in later) / len(later),
                        "update_s": sum(st_.get("update", 0.0) for st_ in later) / len(later),
                        "staleness": [a.get("async/staleness") for a in measured["async"]]}
    out["ratio"] = out["k1"]["steps_per_s"] / out["k0"]["steps_per_s"]
    out["overrides"] = overrides[:-1]
    return out


def trl_step(cpu: bool, s: dict, workdir: Path) -> dict:
    """The same kind of step through TRL's GRPOTrainer and mmrl, each in its own process."""
    try:
        import trl
    except ImportError as e:
        return {"skipped": f"TRL is not importable here ({e}); bring its wheel "
                           f"(scripts/gpu_wheels.sh) to run this stage"}
    from mmrl.bench import e2e

    st = s["step"]
    data = e2e.prepare(workdir, 64 if cpu else 1024, samples=8,
                       shape=None if cpu else STEP_SHAPE)
    if torch.cuda.is_available():  # the saved model's memory goes back before the sides start
        torch.cuda.empty_cache()
    side = dict(group=st["group"], completion=st["completion"], max_pixels=data["max_pixels"],
                placeholders=data["placeholders"], cuda=not cpu)
    out = {"trl_version": trl.__version__}
    for name in ("mmrl", "trl"):
        out[name] = e2e._run_side(name, workdir, side, st["steps"], threads=None,
                                  log=lambda *a: None)
    out["ratio"] = (sorted(out["trl"]["times_s"][1:])[0] /
                    max(1e-9, sorted(out["mmrl"]["times_s"][1:])[0]))
    return out


def run(out: Path, cpu: bool, budget_s: float, log=print, only: set[str] | None = None) -> dict:
    """Every stage (`only`: these stages and the environment; the others are left out of
    gpu.json, to be merged into docs/gpu.json by hand)."""
    import tempfile

    from mmrl.bench import gpu_report

    if not cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu for the dry run")
    started, s = time.perf_counter(), sizes(cpu)
    results: dict = {"date": datetime.date.today().isoformat(), "cpu": cpu,
                     "model": "the tiny twin" if cpu else f"{STEP_SHAPE} (random weights)",
                     "command": " ".join(["bash scripts/gpu_check.sh"] + sys.argv[1:]),
                     "budget_s": budget_s, "stages": {}}
    work = Path(tempfile.mkdtemp(prefix="mmrl-gpu-check-"))

    def stage(name, fn, needs_s: float):
        if only is not None and name not in only | {"environment"}:
            return
        left = budget_s - (time.perf_counter() - started)
        if left < needs_s:
            results["stages"][name] = {
                "skipped": f"time budget: {left:.0f} s left, needs ~{needs_s:.0f} s"}
            return
        t = time.perf_counter()
        log(f"[gpu-check] {name} ...")
        try:
            results["stages"][name] = fn()
        except Exception as e:  # a stage's failure is a result, not the end of the check
            results["stages"][name] = {"failure": f"{type(e).__name__}: {e}",
                                       "traceback": traceback.format_exc()[-3000:]}
        results["stages"][name]["wall_s"] = time.perf_counter() - t
        log(f"[gpu-check] {name}: {time.perf_counter() - t:.0f} s")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    stage("environment", lambda: environment(cpu), 0)
    env = results["stages"]["environment"]
    kernels = ["sdpa", "mmrl_prefix_varlen"]
    small = bundle(cpu, 2 if not cpu else None)
    stage("correctness", lambda: stages.correctness(small, kernels=kernels, **s["correct"]), 20)
    del small
    part = bundle(cpu, None if cpu else UPDATE_LAYERS, checkpointing=not cpu)
    results["layers"] = None if cpu else {"measured": UPDATE_LAYERS, "full": 36}
    results["checkpointing"] = not cpu
    stage("update", lambda: {"cells": stages.update_phase(
        part, cells=s["update_cells"], completion=s["completion"], micro_batch=s["micro_batch"],
        trials=s["trials"], log=log)}, 60)
    stage("generation", lambda: stages.generation(part, trials=s["trials"], **s["gen"]), 30)
    stage("decode", lambda: decode_stage(cpu, part, s), 60)
    results["flops_scale"] = 1.0 if cpu else _depth_scale(part[1])
    del part
    gib = env.get("memory_gib", 24.0)
    stage("grpo step", lambda: grpo_step(cpu, s, work / "step", gib), 90)
    stage("async step", lambda: async_step(cpu, s, work / "async"), 200)
    stage("trl", lambda: trl_step(cpu, s, work / "trl"), 150)
    results["seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "gpu.md").write_text(gpu_report.markdown(results))
    log(f"[gpu-check] wrote {out / 'gpu.md'} in {results['seconds']:.0f} s")
    return results


def _depth_scale(model) -> float:
    """FLOPs of the full-depth model over the reduced one's, per token of a typical prompt
    (what a reduced-depth time is multiplied by to stand for the full model)."""
    from mmrl.models import shapes

    with torch.device("meta"):
        full, _ = shapes.build(STEP_SHAPE, device="meta")
    f = stages.forward_flops(full, "naive", 1024, 4096, 8, 512)
    r = stages.forward_flops(model, "naive", 1024, 4096, 8, 512)
    return f / r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where gpu.md and gpu.json go (default: docs "
                    "on a GPU, runs/gpu_check_cpu with --cpu)")
    ap.add_argument("--cpu", action="store_true", help="every stage at tiny sizes on the CPU")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip stages that would end after this many seconds (default 460 on "
                         "a GPU, none on CPU)")
    ap.add_argument("--stages", default=None,
                    help=f"comma-separated stages to run besides the environment, of "
                         f"{', '.join(STAGES)} (default: all); their gpu.json holds only them")
    args = ap.parse_args(argv)
    out = Path(args.out or ("runs/gpu_check_cpu" if args.cpu else "docs"))
    budget = args.budget_s if args.budget_s is not None else (1e9 if args.cpu else 460)
    torch.manual_seed(0)
    only = None if args.stages is None else {x.strip() for x in args.stages.split(",")}
    if only is not None and only - set(STAGES):
        ap.error(f"--stages: unknown {sorted(only - set(STAGES))}; choose from {STAGES}")
    run(out, args.cpu, budget, only=only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
