"""Benchmark 1 and 3: the update phase (old + ref logprobs, loss, backward) in the naive
G x [prompt, completion] layout vs the shared-prefix layout, on the same tiny model and data.

Both sides run exactly what the trainer runs per micro-batch (mmrl.train.policy.Policy.forward
and mmrl.train.learner.Learner.update): trimmed completion width, entropy in the gradient forward,
`policy_loss` with the global token normaliser, `loss.backward()`. The naive side uses row
micro-batches of `micro_batch` rows; the shared side whole-group micro-batches under the same
token budget (`micro_batch` x (prompt + completion) tokens), which never holds more tokens than a
naive one.
"""
from __future__ import annotations

import contextlib
import copy

import torch

from mmrl import algos
from mmrl.bench.common import interleaved, prompt_of_length, random_completions, tiny_vl
from mmrl.models.codec import Codec
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models import prefix_attention
from mmrl.models.shared_prefix import (shared_prefix_logprobs, split_groups,
                                       token_budget_micro_batches)

# naive: G rows of [prompt, completion]; shared: one row per group with a dense 4-D mask (sdpa);
# varlen: the varlen kernel (flash_attn_varlen_func on GPU, its torch emulation on CPU), every
# group of a micro-batch packed into one pad-free row.
LAYOUTS = ("naive", "shared", "varlen")


@contextlib.contextmanager
def kernel_for(layout: str, *models):
    """Run `models` on the varlen kernel for the varlen layout, on their own kernel otherwise."""
    saved = [m.config._attn_implementation for m in models]
    if layout == "varlen":
        for m in models:
            m.set_attn_implementation(prefix_attention.NAME)
    try:
        yield
    finally:
        for m, name in zip(models, saved):
            m.set_attn_implementation(name)


def attention_scores(prompt_len: int, group: int, completion: int) -> dict:
    """Score-matrix entries per layer and head of one group: naive G(P+C)^2, the dense masked
    row (P+GC)^2, varlen P^2 + G*C*(P+C) (completion tokens but the last: C-1)."""
    c = completion - 1
    return {"naive": group * (prompt_len + completion) ** 2, "shared": (prompt_len + group * c) ** 2,
            "varlen": prompt_len ** 2 + group * c * (prompt_len + c)}


def micro_batches(layout: str, prompts, mask: torch.Tensor, micro_batch: int) -> list[list[int]]:
    n = mask.shape[0]
    if layout == "naive":
        return [list(range(i, min(n, i + micro_batch))) for i in range(0, n, micro_batch)]
    budget = micro_batch * (max(p.input_ids.shape[0] for p in prompts) + mask.shape[1])
    # The dense group mask pads each micro-batch's groups to the longest; varlen packs them.
    return token_budget_micro_batches(prompts, mask, budget, padded=layout != "varlen")


def layout_forward(layout: str, model, prompts, ids, mask, rows, *, pad_id: int,
                   entropy: bool = False, temperature: float = 1.0):
    """The trainer's `_forward` for `rows` in any layout: ((logp[, ent]), width). "shared" packs
    groups in the trainer's runs (split_groups); "whole" packs each group whole (bench/runs.py)."""
    sub_ids, sub_mask = ids[rows], mask[rows]
    width = int(sub_mask.sum(1).max().clamp(min=1))
    sub_ids, sub_mask = sub_ids[:, :width], sub_mask[:, :width]
    sub_prompts = [prompts[i] for i in rows]
    if layout in ("shared", "runs"):
        sub_prompts = split_groups(model, sub_prompts, sub_mask)
    if layout == "naive":
        inputs = collate(sub_prompts, sub_ids, sub_mask, pad_id)
        out = completion_logprobs(model, inputs, sub_ids, sub_mask, temperature=temperature,
                                  return_entropy=entropy)
    else:
        out = shared_prefix_logprobs(model, sub_prompts, sub_ids, sub_mask, temperature=temperature,
                                     return_entropy=entropy, pad_id=pad_id)
    return out, width


def update_phase(layout: str, model, ref_model, prompts, ids, mask, adv, *, pad_id: int,
                 micro_batch: int = 8, beta: float = 0.04, agg: str = "token_mean") -> float:
    """Old and reference logprobs (no grad), then loss + backward per micro-batch; returns the
    summed loss (equal across layouts to float error)."""
    with kernel_for(layout, model, ref_model):
        return _update_phase(layout, model, ref_model, prompts, ids, mask, adv, pad_id=pad_id,
                             micro_batch=micro_batch, beta=beta, agg=agg)


def _update_phase(layout, model, ref_model, prompts, ids, mask, adv, *, pad_id, micro_batch, beta, agg):
    batches = micro_batches(layout, prompts, mask, micro_batch)
    device = next(model.parameters()).device  # the loss runs where the logprobs are
    old = torch.zeros(ids.shape, device=device)
    ref = torch.zeros(ids.shape, device=device)
    adv = adv.to(device)
    model.eval()
    with torch.no_grad():
        for target, m in ((old, model), (ref, ref_model)):
            for rows in batches:
                logp, width = layout_forward(layout, m, prompts, ids, mask, rows, pad_id=pad_id)
                target[rows, :width] = logp.float()
    fmask = mask.float().to(device)
    normalizer = algos.loss_normalizer(fmask, agg)  # global over the micro-batches
    settings = algos.LossSettings(agg=agg, beta=beta, max_len=mask.shape[1])
    model.train()
    model.zero_grad(set_to_none=True)
    total = 0.0
    for rows in batches:
        (logp, ent), width = layout_forward(layout, model, prompts, ids, mask, rows, pad_id=pad_id,
                                            entropy=True)
        loss, _ = algos.policy_loss(
            algos.LossInputs(logp, old[rows, :width], adv[rows], fmask[rows, :width],
                             ref_logp=ref[rows, :width]), settings, normalizer=normalizer)
        loss.backward()
        total += float(loss.detach())
    model.eval()
    return total


class UpdateCase:
    """One benchmark configuration: B prompts of ~P tokens, G completions of C tokens each."""

    def __init__(self, codec: Codec, model, *, prompt_tokens: int, group: int,
                 completion_tokens: int, prompts_per_step: int = 1, seed: int = 0,
                 uneven: bool = False):
        self.model = model
        self.ref = copy.deepcopy(model).eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.pad_id = codec.pad_id
        features = [prompt_of_length(codec, prompt_tokens, seed=seed + i)
                    for i in range(prompts_per_step)]
        self.prompt_len = features[0].input_ids.shape[0]
        self.image_tokens = int((features[0].tensors["mm_token_type_ids"] == 1).sum())
        self.prompts = [f for f in features for _ in range(group)]
        n = len(self.prompts)
        self.ids, self.mask = random_completions(n, completion_tokens, self.pad_id, seed=seed,
                                                uneven=uneven)
        gen = torch.Generator().manual_seed(seed + 1)
        self.adv = torch.randn(n, generator=gen)
        self.group, self.completion_tokens = group, completion_tokens

    def run(self, layout: str, micro_batch: int = 8) -> float:
        return update_phase(layout, self.model, self.ref, self.prompts, self.ids, self.mask,
                            self.adv, pad_id=self.pad_id, micro_batch=micro_batch)

    def pad_fractions(self, micro_batch: int) -> dict:
        """Pad tokens / all tokens the forwards run: naive rows pad to the longest row of their
        micro-batch; varlen rows hold no pad at all."""
        lengths = self.mask.sum(1)
        real = padded = 0
        for rows in micro_batches("naive", self.prompts, self.mask, micro_batch):
            real += int(lengths[rows].sum()) + self.prompt_len * len(rows)
            padded += (int(lengths[rows].max()) + self.prompt_len) * len(rows)
        return {"naive": 1 - real / padded, "varlen": 0.0}

    def measure(self, trials: int, micro_batch: int = 8, warmup: int = 1) -> dict:
        losses = {}

        def runner(layout):
            def fn():
                losses[layout] = self.run(layout, micro_batch)
            return fn

        timings = interleaved({layout: runner(layout) for layout in LAYOUTS}, trials, warmup)
        naive, shared, varlen = timings["naive"], timings["shared"], timings["varlen"]
        return {"varlen": varlen.as_dict(), "speedup_varlen": naive.median / varlen.median,
                "loss_varlen": losses["varlen"],
                "attention_scores": attention_scores(self.prompt_len, self.group, self.completion_tokens),
                "pad_fraction": self.pad_fractions(micro_batch),
            "prompt_tokens": self.prompt_len, "image_tokens": self.image_tokens,
            "group": self.group, "completion_tokens": self.completion_tokens,
            "naive": naive.as_dict(), "shared": shared.as_dict(),
            "speedup": naive.median / shared.median,
            "speedup_min": min(naive.times) / min(shared.times),
            "speedup_cpu": (naive.as_dict()["median_cpu_s"] / shared.as_dict()["median_cpu_s"]),
            "tokens_naive": self.group * (self.prompt_len + self.completion_tokens),
            "tokens_shared": self.prompt_len + self.group * (self.completion_tokens - 1),
            "loss_naive": losses["naive"], "loss_shared": losses["shared"],
        }


def measure_cell(bundle, *, family: str, prompt_tokens: int, group: int, completion_tokens: int,
                 trials: int, micro_batch: int, memory: bool, warmup: int = 1,
                 uneven: bool = False) -> dict:
    """One cell: interleaved trials of the layouts (+ each layout's peak RSS growth in a fresh
    process when `memory`)."""
    case = UpdateCase(*bundle, prompt_tokens=prompt_tokens, group=group,
                      completion_tokens=completion_tokens, uneven=uneven)
    row = case.measure(trials, micro_batch, warmup=warmup)
    if memory:
        row["memory_mb"] = {layout: measure_memory(
            layout, family=family, prompt_tokens=prompt_tokens, group=group, uneven=uneven,
            completion_tokens=completion_tokens, micro_batch=micro_batch) for layout in LAYOUTS}
    return row


def bench_update(*, family: str = "qwen2_5_vl", prompt_tokens: int = 1024, group: int = 8,
                 completion_tokens: int = 64, trials: int = 5, micro_batch: int = 8,
                 model_bundle=None, memory: bool = True) -> dict:
    """Benchmark 1: one configuration, naive vs shared, interleaved trials (+ peak RSS growth
    of each layout in a fresh process)."""
    return {"family": family, "micro_batch": micro_batch, "trials": trials,
            **measure_cell(model_bundle or tiny_vl(family), family=family,
                           prompt_tokens=prompt_tokens, group=group,
                           completion_tokens=completion_tokens, trials=trials,
                           micro_batch=micro_batch, memory=memory)}


def bench_scaling(*, family: str = "qwen2_5_vl", prompt_sizes=(256, 512, 1024, 2048),
                  groups=(4, 8, 16), base_prompt: int = 1024, base_group: int = 8,
                  completion_tokens: int = 64, trials: int = 3, micro_batch: int = 8,
                  model_bundle=None, memory: bool = False, log=print) -> dict:
    """Benchmark 3: update-phase time as P grows (G = base_group) and as G grows (P = base_prompt)."""
    bundle = model_bundle or tiny_vl(family, max_image_tokens=max(prompt_sizes) * 2)
    rows = []
    configs = [(p, base_group) for p in prompt_sizes] + [(base_prompt, g) for g in groups if g != base_group]
    for k, (p, g) in enumerate(configs):
        # One warm-up round for the process (first-call allocations), not per cell.
        row = {"sweep": "P" if g == base_group else "G",
               **measure_cell(bundle, family=family, prompt_tokens=p, group=g,
                              completion_tokens=completion_tokens, trials=trials,
                              micro_batch=micro_batch, memory=memory, warmup=1 if k == 0 else 0)}
        rows.append(row)
        log(f"  P={row['prompt_tokens']:5d} G={g:3d}: naive {row['naive']['median_s']:.3f} s, "
            f"shared {row['shared']['median_s']:.3f} s, x{row['speedup']:.2f}, "
            f"varlen {row['varlen']['median_s']:.3f} s, x{row['speedup_varlen']:.2f}")
    return {"family": family, "micro_batch": micro_batch, "trials": trials,
            "completion_tokens": completion_tokens, "rows": rows}


# ----------------------------------------------------------------------------- memory -----------

def measure_memory(layout: str, *, family: str = "qwen2_5_vl", prompt_tokens: int, group: int,
                   completion_tokens: int, micro_batch: int = 8, threads: int | None = None,
                   uneven: bool = False) -> float:
    """Peak RSS growth (MB) of one update phase in a fresh process: in a process that already
    ran the other layout, freed-but-kept heap would hide the growth."""
    import json
    import os
    import subprocess
    import sys

    spec = dict(layout=layout, family=family, prompt_tokens=prompt_tokens, group=group,
                completion_tokens=completion_tokens, micro_batch=micro_batch,
                threads=threads or torch.get_num_threads(), uneven=uneven)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "mmrl.bench.update", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH_MEMORY ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"memory measurement failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(line.split()[1])


def _memory_main(spec_json: str) -> None:
    import json

    from mmrl.bench.common import PeakRSS

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(True)
    bundle = tiny_vl(spec["family"], max_image_tokens=max(4096, spec["prompt_tokens"] * 2))
    case = UpdateCase(*bundle, prompt_tokens=spec["prompt_tokens"], group=spec["group"],
                      completion_tokens=spec["completion_tokens"], uneven=spec.get("uneven", False))
    with PeakRSS() as mem:
        case.run(spec["layout"], spec["micro_batch"])
    print(f"BENCH_MEMORY {mem.extra / 2**20:.1f}", flush=True)


if __name__ == "__main__":
    import sys

    _memory_main(sys.argv[1])
