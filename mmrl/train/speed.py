"""Where a step's seconds go: the rollout's prefill and decode apart, generated tokens/s, the
decode's achieved bytes/s against the device's peak, and the update's MFU.

Decode reads, per step, every weight it multiplies with (text layers and LM head; the
embedding is a gather of a few rows) plus the keys and values of every cached token of every
row: over the step's time that is the bandwidth it achieved. The peak is the device's HBM figure
where it is known (GPU table below), else a copy bandwidth measured once per process (CPU). The
update's FLOPs count the text model from its widths (shared_prefix.layer_flops: 2 per weight per
token, QK^T and AV per score; x3 for forward and backward; the vision tower and recomputation
under gradient checkpointing are not counted), over a peak measured as a matmul rate once per
process on CPU, or the GPU's table figure.
"""
from __future__ import annotations

import functools
import time

import torch

# Memory bandwidth and dense bf16 peak by device name (vendor figures).
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}
PEAK_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362.1e12}


def _table(table: dict, device: torch.device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in table.items() if k in name), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device: torch.device, mib: int = 64, repeats: int = 3) -> float:
    """Bytes/s the device moves: its table figure, else the best of `repeats` copies of a `mib`
    MiB tensor (read + write counted), measured once per process (~0.1 s on CPU)."""
    known = _table(PEAK_BYTES_PER_S, device)
    if known:
        return known
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


@functools.lru_cache(maxsize=None)
def peak_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 512) -> float:
    """FLOP/s for MFU: the GPU's table figure, else the best of 3 measured n^3 matmuls."""
    known = _table(PEAK_FLOPS, device)
    if known:
        return known
    # Constant values: drawing random ones would advance the run's RNG stream, and a run's
    # samples (and a resume's equality) must not depend on when this is first measured.
    a = torch.full((n, n), 0.5, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(3):
        _sync(device)
        t = time.perf_counter()
        a @ a
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def decode_weight_bytes(model) -> int:
    """Bytes of the weights one decode step multiplies with: every parameter of the text
    decoder but its embedding, plus the LM head."""
    from mmrl.models.shared_prefix import unwrap

    base = unwrap(model)
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    embed = decoder.get_input_embeddings()
    skip = {id(p) for p in embed.parameters()} - {id(p) for p in head.parameters()}
    params = {id(p): p for p in [*decoder.parameters(), *head.parameters()] if id(p) not in skip}
    return sum(p.numel() * p.element_size() for p in params.values())


def update_flops(model, prompt_lens, completion_lens, group: int, shared: bool) -> float:
    """FLOPs of the update's forward and backward (x3 a forward) over the text model, for rows
    of `prompt_lens` / `completion_lens` in groups of `group` rows (shared: each group's prompt
    runs once, as the shared-prefix layout runs it; else every row runs its prompt)."""
    from mmrl.models.shared_prefix import layer_flops, unwrap

    text = unwrap(model).config.get_text_config()
    return 3 * forward_flops(layer_flops(model), text.num_hidden_layers,
                             2 * text.hidden_size * text.vocab_size,
                             prompt_lens, completion_lens, group, shared)


def forward_flops(flops: tuple[int, int], layers: int, head: int, prompt_lens, completion_lens,
                  group: int, shared: bool) -> float:
    """One forward's FLOPs over rows of `prompt_lens` / `completion_lens` (update_flops' count,
    from the widths alone: `flops` = shared_prefix.layer_flops, `head` = FLOPs of the LM head a
    completion token; mmrl plan's time prediction uses it too)."""
    linear, score = flops
    tokens = pairs = 0.0
    for start in range(0, len(prompt_lens), group):
        p, cs = prompt_lens[start], completion_lens[start:start + group]
        if shared:
            tokens += p + sum(cs)
            pairs += p * p / 2 + sum(c * p + c * c / 2 for c in cs)
        else:
            tokens += sum(p + c for c in cs)
            pairs += sum((p + c) ** 2 / 2 for c in cs)
    return tokens * layers * linear + pairs * layers * score + sum(completion_lens) * head


def engine_metrics(timing: dict, generated: int, weight_bytes: int, peak: float) -> dict:
    """An engine's step timing (`take_timing`: prefill_s, decode_s, decode_forwards,
    kv_read_bytes, compile counts) as metrics: prefill and decode seconds (parts of
    time/rollout), generated tokens/s over them, decode bytes/s and its share of the peak."""
    if not timing.get("decode_forwards") and not timing.get("prefill_s"):
        return {}
    decode, prefill = timing["decode_s"], timing["prefill_s"]
    read = weight_bytes * timing["decode_forwards"] + timing["kv_read_bytes"]
    rate = read / decode if decode > 0 else 0.0
    out = {"time/rollout_prefill": prefill, "time/rollout_decode": decode,
           "speed/generated_tokens_per_s": generated / max(prefill + decode, 1e-9),
           "speed/decode_bytes_per_s": rate, "speed/decode_bandwidth_share": rate / peak}
    out.update({k: v for k, v in timing.items() if k.startswith("decode/")})
    return out


def update_mfu(model, batch, seconds: float, shared: bool) -> dict:
    """The update's MFU: `update_flops` of the batch's rows over `seconds` x the peak."""
    param = next(model.parameters())
    if seconds <= 0:
        return {}
    group = int((batch.group_ids == batch.group_ids[0]).sum())
    flops = update_flops(model, [p.input_ids.shape[0] for p in batch.prompts],
                         batch.completion_mask.sum(1).tolist(), group, shared)
    return {"speed/update_mfu": flops / seconds / peak_flops(param.device, param.dtype)}


# The phases of the end-of-run table, in step order: time/* keys (rollout_* are parts of rollout).
PHASES = ("rollout", "rollout_prefill", "rollout_decode", "scoring", "logprob", "advantage",
          "update", "sync")


class PhaseTotals:
    """Sums each step's time/* metrics over the run (this process's steps) for summary.json and
    the printed phase table; the decode share of the peak bandwidth weighted by decode time."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.steps, self.read_s, self.peak_s, self.tokens = 0, 0.0, 0.0, 0.0

    def observe(self, metrics: dict) -> None:
        self.steps += 1
        for k in (*PHASES, "step"):
            if f"time/{k}" in metrics:
                self.seconds[k] = self.seconds.get(k, 0.0) + metrics[f"time/{k}"]
        decode = metrics.get("time/rollout_decode", 0.0)
        if "speed/decode_bandwidth_share" in metrics:
            self.read_s += metrics["speed/decode_bytes_per_s"] * decode
            self.peak_s += metrics["speed/decode_bytes_per_s"] / max(
                metrics["speed/decode_bandwidth_share"], 1e-30) * decode

    def summary(self) -> dict:
        total = self.seconds.get("step", 0.0)
        out = {"steps": self.steps, "seconds": dict(self.seconds),
               "share": {k: v / total for k, v in self.seconds.items() if total > 0 and k != "step"}}
        decode = self.seconds.get("rollout_decode", 0.0)
        if decode > 0 and self.peak_s > 0:
            out["decode_bytes_per_s"] = self.read_s / decode
            out["decode_bandwidth_share"] = self.read_s / self.peak_s
        return out


def phase_rows(phases: dict) -> list[tuple[str, str]]:
    """The printed phase table's rows: seconds and share of the step per phase, then the decode
    bandwidth share."""
    rows = []
    for k in PHASES:
        if k in phases.get("seconds", {}):
            name = f"  {k.replace('rollout_', '')} (in rollout)" if k.startswith("rollout_") else k
            rows.append((name, f"{phases['seconds'][k]:.2f} s ({100 * phases['share'].get(k, 0):.0f}%)"))
    if "decode_bandwidth_share" in phases:
        rows.append(("decode bandwidth", f"{phases['decode_bytes_per_s'] / 1e9:.2f} GB/s = "
                     f"{100 * phases['decode_bandwidth_share']:.1f}% of peak"))
    return rows
