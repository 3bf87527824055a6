"""`mmrl train`'s memory check: the plan (memory.py) for this device's memory, the process count
and the strategy, made before the model is loaded. A run predicted over the usable memory stops
(train.memory_check=refuse) or is told so (warn), with the phase, the numbers and a fix: the
recipe's 1-GPU overlay, more GPUs with a sharding strategy, or the knob that saves the most.

    check = memory_check(cfg, "recipes/vqa/config.yaml", overrides, world=1)
    check.line       # one line for the config summary
    check.refuses    # True: stop, printing check.message
    check.predicted  # {stage: bytes} for the run summary (None: no plan)
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from mmrl import plan

# The trainer's timed stages (train/loop.py) and the plan's phases they hold.
STAGE_PHASES = {"rollout": ("rollout",), "logprob": ("logprobs",),
                "update": ("update", "optimizer step")}
OVERLAY = "1gpu.yaml"  # a recipe's one-GPU setting, beside its config.yaml
GPUS_PER_NODE = 8
SHARDED = (("zero2", ["train.parallel=deepspeed",
                      "train.deepspeed_config=scripts/deepspeed/zero2.json"]),
           ("zero3", ["train.parallel=deepspeed",
                      "train.deepspeed_config=scripts/deepspeed/zero3.json"]),
           ("fsdp2", ["train.parallel=fsdp2"]))


def device_memory_gib() -> float | None:
    """Total memory of this process's CUDA device (GiB); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.cuda.get_device_properties(index).total_memory / plan.GIB


@dataclass
class Check:
    line: str
    refuses: bool = False
    message: str = ""
    predicted: dict | None = None


def memory_check(cfg, config_path: str | None, overrides: list[str], world: int) -> Check:
    """The plan of this run before its model loads (see the module doc)."""
    if not cfg.train.checks_memory:
        return Check("memory check: off (train.memory_check=off)")
    gpu = device_memory_gib()
    if gpu is None:
        return Check("memory check: none on CPU (the plan is for CUDA devices); the run "
                     "summary gives the measured peak resident set per stage")
    try:
        strategy = config_strategy(cfg, world)
        if strategy is None:
            return Check("memory check: skipped (the plan does not model ZeRO-1 or offload)")
        p, _ = _predict(cfg, plan.Cluster(gpu, world, strategy), world)
    except ValueError as e:  # no shape for the model, no media budget: say so and go on
        return Check(f"memory check: skipped ({e})")
    except Exception as e:  # noqa: BLE001  a plan that breaks must not stop a run it only advises
        return Check(f"memory check: skipped (the plan failed: {type(e).__name__}: {e})")
    predicted = {stage: max(p.phases[ph] for ph in phases)
                 for stage, phases in STAGE_PHASES.items()}
    where = f"{world} x {gpu:.1f} GiB, {strategy}"
    if p.fits:
        return Check(f"memory check: predicted peak {p.peak / plan.GIB:.1f} GiB in "
                     f"{p.phase} of usable {p.usable / plan.GIB:.1f} GiB per GPU ({where})",
                     predicted=predicted)
    message = "\n".join([
        f"memory check: this run does not fit: predicted peak {p.peak / plan.GIB:.1f} GiB per "
        f"GPU in the {p.phase} phase, over the usable {p.usable / plan.GIB:.1f} GiB ({where}; "
        f"90% of the GPU after 1 GiB of CUDA context; docs/memory.md)."
        + (" The model was not loaded." if cfg.train.refuses_unfit else ""), "Fix:",
        *[f"  - {fix}" for fix in fixes(cfg, config_path, overrides, world, gpu, p)],
        "  (or train.memory_check=warn to run anyway)"])
    refuses = cfg.train.refuses_unfit
    line = ("memory check: refused" if refuses else "memory check: WARNING, predicted not to "
            f"fit: {p.peak / plan.GIB:.1f} GiB in {p.phase} over {p.usable / plan.GIB:.1f} GiB")
    return Check(line, refuses=refuses, message=message, predicted=predicted)


def _predict(cfg, cluster: plan.Cluster, world: int):
    facts, _ = plan.config_facts(cfg)
    workload, said = plan.config_workload(cfg, facts, world)
    return plan.predict(facts, workload, cluster), said


def fixes(cfg, config_path, overrides: list[str], world: int, gpu: float,
          p: plan.Prediction) -> list[str]:
    """The overlay (a recipe's 1gpu.yaml not in use), more GPUs with the first sharding strategy
    that fits, and the single knob whose plan saves the most."""
    from mmrl import config

    out = []
    overlay = Path(config_path).parent / OVERLAY if config_path else None
    if overlay and overlay.exists() and str(overlay) not in overrides and \
            overlay.name not in {Path(o).name for o in overrides}:
        try:
            q = _variant(config_path, overrides + [str(overlay)], world, gpu)
            out.append(f"the recipe's one-GPU setting ({q.peak / plan.GIB:.1f} GiB; "
                       f"{'fits' if q.fits else 'still does not fit'}; it says what it gives up): "
                       f"add {overlay}")
        except (ValueError, config.ConfigError):
            pass
    gpus = GPUS_PER_NODE if world < GPUS_PER_NODE else 2 * world
    if cfg.rollout.prompts_per_step % gpus == 0:
        for strategy, knobs in SHARDED:
            try:
                q = _variant(config_path, overrides + knobs, gpus, gpu, strategy)
            except (ValueError, config.ConfigError):
                continue
            if q.fits:
                out.append(f"{gpus} GPUs with {strategy} ({q.peak / plan.GIB:.1f} GiB a GPU): "
                           f"bash scripts/train.sh {gpus} "
                           f"{shlex.join([config_path or 'CONFIG', *overrides, *knobs])}")
                break
    best = _best_knob(cfg, config_path, overrides, world, gpu, p)
    if best:
        knob, q = best
        out.append(f"the knob that saves the most: {' '.join(knob)} -> {q.peak / plan.GIB:.1f} "
                   f"GiB in {q.phase} ({'fits' if q.fits else 'still does not fit'})")
    return out


def knobs(cfg) -> list[list[str]]:
    """Single changes that cut a phase of the plan, each keeping the recipe's task."""
    r, t, m = cfg.rollout, cfg.train, cfg.model
    out = [["model.lora.r=64"] if not m.lora.r else None,
           ["model.gradient_checkpointing=true"] if not m.gradient_checkpointing else None,
           ["train.micro_batch_size=1"] if t.micro_batch_size > 1 else None,
           ["rollout.shared_prefill=true"] if r.runs_hf_generate and not r.shared_prefill
           else None,
           ["rollout.shared_prefill=true", "rollout.rounds_of=2"]
           if r.runs_hf_generate and r.num_generations > 2 and (r.rounds_of or 99) > 2 else None]
    return [k for k in out if k]


def _best_knob(cfg, config_path, overrides, world, gpu, p):
    from mmrl import config

    best = None
    for knob in knobs(cfg):
        try:
            q = _variant(config_path, overrides + knob, world, gpu)
        except (ValueError, config.ConfigError):
            continue
        if q.peak < p.peak and (best is None or q.peak < best[1].peak):
            best = (knob, q)
    return best


def _variant(config_path, overrides: list[str], world: int, gpu: float,
             strategy: str | None = None) -> plan.Prediction:
    from mmrl import config

    cfg = config.load(config_path, overrides, world=world)
    strategy = strategy or config_strategy(cfg, world)
    if strategy is None:
        raise ValueError("not modelled")
    return _predict(cfg, plan.Cluster(gpu, world, strategy), world)[0]


def _deepspeed_strategy(cfg, world: int) -> str | None:
    """zero2 / zero3 from the DeepSpeed JSON the run would use; None where the plan has no
    model of it (ZeRO-1, ZeRO-Offload: optimizer state or parameters in host memory)."""
    from mmrl.train.parallel import deepspeed_config

    zero = deepspeed_config(cfg, world).get("zero_optimization", {})
    offloaded = any(isinstance(zero.get(k), dict) and zero[k].get("device") in HOST_DEVICES
                    for k in ("offload_optimizer", "offload_param"))
    return None if offloaded else {2: "zero2", 3: "zero3"}.get(int(zero.get("stage", 0)))


HOST_DEVICES = ("cpu", "nvme")  # DeepSpeed offload targets
# train.parallel resolved (mmrl/train/parallel.py) -> the plan's strategy (None: not modelled)
_RESOLVED = {"ddp": lambda cfg, world: "ddp", "fsdp2": lambda cfg, world: "fsdp2",
             "deepspeed": _deepspeed_strategy}


def config_strategy(cfg, world: int) -> str | None:
    """The plan's strategy for a run of `cfg` on `world` processes: train.parallel, with auto
    read from the launcher as the trainer reads it; None for a setting the plan cannot model."""
    from mmrl.train.parallel import resolve

    return _RESOLVED[resolve(cfg)](cfg, world)
