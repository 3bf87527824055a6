"""The time model: a roofline floor per phase of a step, predicted from the memory plan's Facts
and Workload and a device's peaks, and the same floor over an assumed efficiency
(docs/performance.md, "What mmrl plan predicts").

    times(facts, workload, peaks("H100")) -> {"prefill": Phase, "decode": Phase, "update": ...}

Every count is speed.py's, so a run's measured metrics compare term by term: decode reads per
step the weights it multiplies with (speed.decode_weight_bytes) and the keys and values of every
cached token of every row, as HF generate's timing counts them (models/forward.py); prefill,
decode and update FLOPs are speed.forward_flops from shared_prefix.layer_flops (the vision and
audio encoders are not counted). A phase's floor is the larger of bytes / peak bandwidth and
FLOPs / peak FLOP/s: no run can beat it; its expected time adds launch costs (below). The plan
bounds completions at C = max_new_tokens, so where EOS comes earlier it predicts the longest
step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mmrl.plan.memory import Facts, Workload
from mmrl.train import speed

# The expected time of a phase is its floor over an efficiency plus a fixed cost per decoder
# layer per pass: Python and kernel launches, which dominate small models and eager decode.
# EFFICIENCY is the share of the floor the work itself reaches once launches are apart: assumed
# (typical of large dense matmuls and a bandwidth-bound decode), not yet measured on a GPU.
EFFICIENCY = {"prefill": 0.5, "decode": 0.6, "update": 0.4}
# Seconds per decoder layer per eager pass, by device type. cuda: gpu.md's eager HF decode on an
# H200 at 3B, 49.6 ms a step over 36 layers with a 1.3 ms bandwidth floor; cpu: the tiny
# model's decode step here, 5-28 ms over 4 layers by load (docs/performance.md's table, and
# tests/plan/test_timing.py: 50-100 ms for 11 steps when the machine is quiet).
LAYER_OVERHEAD_S = {"cuda": 1.4e-3, "cpu": 2e-3}
# Passes' worth of launches a prefill runs: the text layers, and the vision or audio encoder and
# HF generate's setup (positions, expanding the rows, the cache) about as much again twice.
PREFILL_PASSES = 3
# Passes' worth of launches an update runs per micro-batch: the forward, the backward (~2), the
# shared-prefix layout's per-group masks and splits, the logprob and entropy head and the
# optimizer step over every tensor. Calibrated on CPU (the tiny model's update, one micro-batch:
# 0.05 s quiet to 0.4 s loaded, of which the FLOPs floor is ~3 ms); on a GPU an assumption.
UPDATE_PASSES = 6


@dataclass(frozen=True)
class Peaks:
    name: str
    bytes_per_s: float
    flops: float
    layer_overhead_s: float = LAYER_OVERHEAD_S["cuda"]


def peaks(name: str, dtype: torch.dtype = torch.float32) -> Peaks:
    """A named GPU's datasheet peaks (speed.PEAK_BYTES_PER_S / PEAK_FLOPS, dense bf16), or
    "cpu": this machine's copy bandwidth and matmul rate, measured as speed.py measures them."""
    if name == "cpu":
        cpu = torch.device("cpu")
        return Peaks("cpu (measured)", speed.copy_bandwidth(cpu), speed.peak_flops(cpu, dtype),
                     LAYER_OVERHEAD_S["cpu"])
    if name not in speed.PEAK_BYTES_PER_S:
        raise ValueError(f"device {name!r}: use cpu or one of {', '.join(speed.PEAK_BYTES_PER_S)}")
    return Peaks(name, speed.PEAK_BYTES_PER_S[name], speed.PEAK_FLOPS[name])


@dataclass(frozen=True)
class Phase:
    flops: float
    bytes: float  # bytes read (decode); 0 where the phase is counted in FLOPs alone
    floor_s: float  # max(bytes / peak bandwidth, flops / peak FLOP/s)
    expected_s: float  # floor_s / EFFICIENCY[phase] + passes x layers x layer_overhead_s
    passes: int  # forward passes through the decoder layers (launch cost)


def _phase(name: str, flops: float, read: float, passes: int, layers: int, p: Peaks) -> Phase:
    floor = max(read / p.bytes_per_s, flops / p.flops)
    return Phase(flops, read, floor,
                 floor / EFFICIENCY[name] + passes * layers * p.layer_overhead_s, passes)


def decode_forwards(w: Workload) -> int:
    """Decode forwards a step runs: the first token comes from the prefill."""
    return max(0, w.completion - 1)


def decode_bytes(f: Facts, w: Workload) -> int:
    """Bytes one step's decode reads: the weights per forward, and per forward k (1..C-1) every
    row's P + k cached tokens' keys and values (HF generate's kv_read_bytes, forward.py)."""
    n, rows = decode_forwards(w), w.prompts * w.group
    kv = f.kv_per_token * rows * (n * w.prompt_tokens + n * (n + 1) // 2)
    return f.decode_weight_bytes * n + kv


def _head(f: Facts) -> int:
    return 2 * f.hidden * f.vocab


def times(f: Facts, w: Workload, p: Peaks) -> dict[str, Phase]:
    """Prefill, decode and update of one process's step (HF generate's rollout)."""
    rows, n = w.prompts * w.group, decode_forwards(w)
    prefills = w.prompts if w.shared_prefill else rows  # rows prefilled, a prompt each
    prefill = speed.forward_flops(f.layer_flops, f.layers, _head(f), [w.prompt_tokens] * prefills,
                                  [1] * prefills, 1, shared=True)
    linear, score = f.layer_flops
    # per forward k every row runs one token through the layers and head and scores P + k keys
    decode = rows * (n * (f.layers * linear + _head(f))
                     + f.layers * score * (n * w.prompt_tokens + n * (n + 1) / 2))
    update = 3 * speed.forward_flops(f.layer_flops, f.layers, _head(f),
                                     [w.prompt_tokens] * rows, [w.completion] * rows, w.group,
                                     w.shared_prefix)
    update_passes = UPDATE_PASSES * math.ceil(rows / w.micro_batch)
    return {"prefill": _phase("prefill", prefill, 0, PREFILL_PASSES, f.layers, p),
            "decode": _phase("decode", decode, decode_bytes(f, w), n, f.layers, p),
            "update": _phase("update", update, 0, update_passes, f.layers, p)}


def describe(phases: dict[str, Phase], w: Workload, p: Peaks) -> str:
    """A few lines for `mmrl plan`: each phase's floor and expected seconds, and tokens/s."""
    gen = w.prompts * w.group * w.completion
    lines = [f"time per step on {p.name} ({p.bytes_per_s / 1e9:.0f} GB/s, "
             f"{p.flops / 1e12:.3g} TFLOP/s, {p.layer_overhead_s * 1e3:g} ms a layer a pass): "
             "floor (at peak) / expected"]
    for k, ph in phases.items():
        read = f"{ph.bytes / 1e9:.3g} GB read, " if ph.bytes else ""
        what = f"{read}{ph.flops / 1e12:.3g} TFLOP"
        lines.append(f"  {k:8s} {ph.floor_s:10.4g} s / {ph.expected_s:10.4g} s  ({what}; "
                     f"efficiency {EFFICIENCY[k]:g}, {ph.passes} pass(es) of launches)")
    roll = phases["prefill"].expected_s + phases["decode"].expected_s
    lines.append(f"  generated tokens/s: {gen / max(roll, 1e-12):,.0f} expected "
                 f"({gen} tokens at C = max_new_tokens)")
    return "\n".join(lines)
