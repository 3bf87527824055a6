"""Benchmark "long": what sequence parallelism, token-budget micro-batches and the frozen-encoder
cache buy on long inputs (`mmrl bench --which long`).

The mechanisms are driven directly, on a tiny-width Qwen2.5-VL (text hidden 256, 4 layers,
4 heads; vision width 64, depth 2) and long videos of 112x112 frames (16 merged tokens per two
frames), in the shared-prefix layout on the varlen kernel (what flash_attention_2 runs):

1 sequence parallelism: forward + backward of one group (G completions after a prompt holding
  one video of 16 / 64 / 256 frames) in one process (SP=1) and in two gloo processes under
  torchrun (SP=2); one thread per process, each measured in fresh processes: the peak growth
  of tensor memory (the larger rank's; the profiler's allocation record) and the median time.
2 micro-batches: the update phase through the trainer (`Trainer.learn`: advantages, old
  logprobs, two update iterations, the optimizer steps at lr 1e-30) of a mixed batch
  (images, short and long videos) with row-count micro-batches of G rows (one whole group each,
  the best a row count can do) and of G/2 rows (what a tighter memory allows), each against
  token-budget ones whose budget is the largest row-count micro-batch, so no token-budget
  forward holds more tokens than the row count's largest one.
3 encoder cache: a step with num_iterations = 2 and beta > 0 (old and reference logprobs, two
  update iterations) with the vision tower frozen: the tower's time and the step's, with and
  without the cache.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

from mmrl import algos
from mmrl.bench.common import PeakAllocated, interleaved, random_completions
from mmrl.models import get_adapter, prefix_attention
from mmrl.models.codec import Codec
from mmrl.models.encoder_cache import EncoderCache
from mmrl.models.shared_prefix import shared_prefix_logprobs
from mmrl.types import RolloutBatch, Sample

TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2)
FRAME = 112  # px: 4 x 4 merged tokens per temporal patch (2 frames)


def model_and_processor(seed: int = 0):
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=seed, **TINY)
    model.set_attn_implementation(prefix_attention.NAME)
    return Codec(adapter, processor), model


def media_prompt(codec: Codec, i: int, *, frames: int = 0, image: int = 0):
    """A prompt with one video of `frames` frames or one image of `image` px square."""
    rng = np.random.default_rng(i)
    kind = "video" if frames else "image"
    sample = Sample(id=f"long-{i}", messages=[{"role": "user", "content": [
        {"type": kind}, {"type": "text", "text": "What happens? Answer with <answer>N</answer>."}]}])
    if frames:
        video = rng.integers(0, 256, (frames, FRAME, FRAME, 3), dtype=np.uint8)
        return codec.prompt_features(sample, videos=[video], video_fps=2.0)
    from PIL import Image
    pixels = rng.integers(0, 256, (image, image, 3), dtype=np.uint8)
    return codec.prompt_features(sample, [Image.fromarray(pixels)])


def _loss(logp, old, adv, mask, normalizer):
    ratio = torch.exp(logp - old)
    per_token = torch.maximum(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.2))
    return algos.aggregate_loss(per_token, mask, "token_mean", normalizer=normalizer)


# ----------------------------------------------------------------------------- 1: SP ------------

def _sp_worker(spec: dict) -> None:
    """One rank of the SP benchmark (run under torchrun): writes rank<r>.json to spec["out"]."""
    import torch.distributed as dist

    from mmrl.models import ulysses
    from mmrl.train.dist import init
    from mmrl.train.sp import make_layout

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    info = init()
    sp = make_layout(info, info.world).sequence
    codec, model = model_and_processor()
    ulysses.install(model, sp)
    model.train()
    prompt = media_prompt(codec, 0, frames=spec["frames"])
    pad = codec.pad_id
    ids, mask = random_completions(spec["group"], spec["completion"], pad)
    rows = [prompt] * spec["group"]

    def step():
        model.zero_grad(set_to_none=True)
        if sp.size > 1:
            logp = ulysses.sequence_parallel_logprobs(model, rows, ids, mask, sp, shared_prefix=True,
                                                      pad_id=pad)
        else:
            logp = shared_prefix_logprobs(model, rows, ids, mask, pad_id=pad)
        (logp * mask).sum().backward()

    with PeakAllocated() as mem:  # tensor memory, as a GPU counts it (not timed)
        step()
    times = []
    for _ in range(spec["trials"]):
        if info.enabled:
            dist.barrier()
        start = time.perf_counter()
        step()
        if info.enabled:
            dist.barrier()
        times.append(time.perf_counter() - start)
    with open(os.path.join(spec["out"], f"rank{info.rank}.json"), "w") as f:
        json.dump({"rank": info.rank, "peak_mb": mem.extra / 2**20, "times_s": times,
                   "tokens": int(prompt.input_ids.shape[0])}, f)
    if info.enabled:
        dist.destroy_process_group()


def measure_sp(frames: int, size: int, *, group: int, completion: int, trials: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory() as out:
        spec = dict(frames=frames, group=group, completion=completion, trials=trials, out=out)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={size}",
               "--master_addr=127.0.0.1", f"--master_port={29400 + os.getpid() % 500}",
               "-m", "mmrl.bench.long", json.dumps(spec)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        files = sorted(Path(out).glob("rank*.json"))
        if proc.returncode != 0 or len(files) != size:
            raise RuntimeError(f"SP benchmark ({frames} frames, SP={size}) failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(f.read_text()) for f in files]
    slowest = [max(r["times_s"][t] for r in rows) for t in range(trials)]
    return {"peak_mb": max(r["peak_mb"] for r in rows), "median_s": float(np.median(slowest)),
            "times_s": slowest, "prompt_tokens": rows[0]["tokens"]}


def bench_sp(frames=(16, 64, 256), *, group: int = 4, completion: int = 32, trials: int = 3,
             log=print) -> dict:
    out = []
    for n in frames:
        one, two = (measure_sp(n, size, group=group, completion=completion, trials=trials)
                    for size in (1, 2))
        out.append({"frames": n, "prompt_tokens": one["prompt_tokens"], "sp1": one, "sp2": two,
                    "memory_ratio": two["peak_mb"] / one["peak_mb"],
                    "speedup": one["median_s"] / two["median_s"]})
        log(f"  {n} frames ({one['prompt_tokens']} tokens): SP=1 {one['peak_mb']:.0f} MB "
            f"{one['median_s']:.2f} s, SP=2 {two['peak_mb']:.0f} MB {two['median_s']:.2f} s "
            f"(memory x{out[-1]['memory_ratio']:.2f})")
    return {"group": group, "completion": completion, "trials": trials, "rows": out}


# ----------------------------------------------------------------------------- 2: micro-batches -

def trainer(group: int, run_dir: str):
    """The trainer `mmrl train` builds, on the bench's model, one process: the update below is
    its `learn` stage (advantages, old logprobs, the Learner's update over the Policy's
    micro-batch plan). num_iterations = 2, so old logprobs are taken as GRPO with mu = 2 does;
    lr 1e-30 leaves the float32 weights as they are, so every trial starts alike."""
    from mmrl import config
    from mmrl.train.loop import Trainer

    tiny = ", ".join(f"{k}: {v}" for k, v in TINY.items())
    cfg = config.load(None, [
        f"data.train={run_dir}/data/train.jsonl", "data.generate=counting",  # unread: a dataset
        "data.generate_kwargs={n_train: 4, n_eval: 1}", "model.family=qwen2_5_vl",
        "model.path=tiny", f"model.tiny={{{tiny}}}", f"model.attn_implementation={prefix_attention.NAME}",
        f"rollout.num_generations={group}", "rewards=[{name: accuracy}]", "algo.agg=token_mean",
        "algo.num_iterations=2", "train.lr=1e-30", "train.max_grad_norm=0", "log.progress=off",
        "log.tensorboard=false", "log.rollouts_every=0", f"log.run_dir={run_dir}/run"])
    return Trainer(cfg)


class MixedBatch:
    """Images, short and long videos, G completions each (rows group-major), as a rollout."""

    def __init__(self, trainer, *, group: int, completion: int, seed: int = 0):
        specs = [dict(image=56), dict(image=84), dict(image=56), dict(image=112),
                 dict(frames=8), dict(frames=8), dict(frames=64), dict(frames=64)]
        self.trainer, self.policy, self.group = trainer, trainer.policy, group
        policy = trainer.policy
        prompts = [media_prompt(policy.codec, seed + i, **s)
                   for i, s in enumerate(specs)]
        self.rows = [p for p in prompts for _ in range(group)]
        n = len(self.rows)
        ids, self.mask = random_completions(n, completion, policy.codec.pad_id, seed=seed, uneven=True)
        self.batch = RolloutBatch(prompts=self.rows, completion_ids=ids, completion_mask=self.mask,
                                  group_ids=torch.arange(n) // group, sampler_logp=None,
                                  texts=[""] * n, truncated=torch.zeros(n, dtype=torch.bool))
        self.adv = torch.randn(n, generator=torch.Generator().manual_seed(seed))

    def plans(self, rows_per_batch: int) -> dict[str, dict]:
        """The Policy's settings for row-count micro-batches of `rows_per_batch` rows, and for
        token-budget ones whose budget is the largest row-count micro-batch (the memory the row
        count needs anyway)."""
        n = len(self.rows)
        by_rows = [list(range(i, min(n, i + rows_per_batch))) for i in range(0, n, rows_per_batch)]
        return {"rows": {"micro_batch_size": rows_per_batch, "max_tokens": None},
                "tokens": {"micro_batch_size": rows_per_batch,
                           "max_tokens": max(self.tokens(b) for b in by_rows)}}

    def use(self, plan: dict) -> list[list[int]]:
        self.policy.micro_batch_size, self.policy.max_tokens = plan["micro_batch_size"], plan["max_tokens"]
        return self.policy.micro_batches(self.batch)

    def tokens(self, rows: list[int]) -> int:
        prompts = {id(self.rows[i]): self.rows[i].input_ids.shape[0] for i in rows}
        return sum(prompts.values()) + int(self.mask[rows].sum())

    def update(self, plan: dict) -> float:
        """The update phase of a step (`Trainer.learn`) -> the loss."""
        self.use(plan)
        return self.trainer.learn(self.batch, self.adv, {"accuracy": self.adv.tolist()})["loss/loss"]


def bench_micro_batches(*, group: int = 8, completion: int = 32, trials: int = 5, log=print) -> dict:
    """Per row count (a whole group; half a group, what a tighter memory allows): both plans'
    update time through the trainer's learn stage, interleaved, and their forwards and
    largest forward."""
    with tempfile.TemporaryDirectory() as run_dir:
        t = trainer(group, run_dir)
        try:
            return _micro_batch_cells(MixedBatch(t, group=group, completion=completion), group,
                                      completion, trials, log)
        finally:
            t.close()


def _micro_batch_cells(case: MixedBatch, group: int, completion: int, trials: int, log) -> dict:
    cells = []
    for rows_per_batch in (group, group // 2):
        plans = case.plans(rows_per_batch)
        losses = {}

        def runner(by, plans=plans, losses=losses):
            def fn():
                losses[by] = case.update(plans[by])
            return fn

        timings = interleaved({by: runner(by) for by in plans}, trials)
        cell = {"rows_per_batch": rows_per_batch,
                "speedup": timings["rows"].median / timings["tokens"].median,
                # CPU time of this process: what a loaded machine's wall clock hides
                "cpu_speedup": (timings["rows"].as_dict()["median_cpu_s"]
                                / timings["tokens"].as_dict()["median_cpu_s"])}
        for by, plan in plans.items():
            cut = case.use(plan)
            cell[by] = {**timings[by].as_dict(), "forwards": len(cut), "loss": losses[by],
                        "largest_forward_tokens": max(case.tokens(b) for b in cut)}
        cells.append(cell)
        log(f"  {rows_per_batch} rows: {cell['rows']['forwards']} forwards "
            f"{timings['rows'].median:.2f} s; token budget {cell['tokens']['largest_forward_tokens']}: "
            f"{cell['tokens']['forwards']} forwards {timings['tokens'].median:.2f} s: "
            f"x{cell['speedup']:.2f}")
    return {"group": group, "completion": completion, "trials": trials, "cells": cells,
            "prompt_tokens": sorted({int(p.input_ids.shape[0]) for p in case.rows})}


# ----------------------------------------------------------------------------- 3: cache ---------

@contextmanager
def timed_module(modules, box: list):
    """Add each call's wall time of `modules` to box[0]."""
    starts = {}

    def pre(module, args):
        starts[id(module)] = time.perf_counter()

    def post(module, args, out):
        box[0] += time.perf_counter() - starts.pop(id(module))

    hooks = [h for m in modules for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def bench_encoder_cache(*, group: int = 4, completion: int = 32, frames: int = 32, prompts: int = 4,
                        trials: int = 5, log=print) -> dict:
    codec, model = model_and_processor()
    model.model.visual.requires_grad_(False)  # model.freeze: [vision]
    ref = copy.deepcopy(model).requires_grad_(False).eval()
    feats = [media_prompt(codec, i, frames=frames) for i in range(prompts)]
    rows = [p for p in feats for _ in range(group)]
    pad = codec.pad_id
    ids, mask = random_completions(len(rows), completion, pad, uneven=True)
    adv = torch.randn(len(rows), generator=torch.Generator().manual_seed(0))
    batches = [list(range(i, i + group)) for i in range(0, len(rows), group)]
    cache = EncoderCache(model)
    encoder = {"cached": [0.0], "every forward": [0.0]}

    def step(name: str):
        use = cache if name == "cached" else None
        cache.clear()  # a new step: new prompts

        def forward(m, index):
            sub = [rows[i] for i in index]
            with use.serve(m, sub, True) if use else nullcontext():
                return shared_prefix_logprobs(m, sub, ids[index], mask[index], pad_id=pad)

        with timed_module([model.model.visual, ref.model.visual], encoder[name]):
            with torch.no_grad():
                model.eval()
                old = torch.cat([forward(model, b) for b in batches])
                torch.cat([forward(ref, b) for b in batches])  # the KL reference
            model.train()
            normalizer = algos.loss_normalizer(mask.float(), "token_mean")
            for _ in range(2):  # num_iterations
                model.zero_grad(set_to_none=True)
                for b in batches:
                    loss = _loss(forward(model, b), old[b] - 0.01, adv[b], mask[b].float(), normalizer)
                    loss.backward()

    names = list(encoder)
    timings = interleaved({n: (lambda n=n: step(n)) for n in names}, trials)
    runs = {n: trials + 1 for n in names}  # warm-up included in the encoder totals
    out = {"group": group, "completion": completion, "frames": frames, "prompts": prompts,
           "trials": trials, "cache_reason": cache.reason}
    for n in names:
        out[n] = {**timings[n].as_dict(), "encoder_s": encoder[n][0] / runs[n]}
    out["encoder_speedup"] = out["every forward"]["encoder_s"] / out["cached"]["encoder_s"]
    out["step_speedup"] = timings["every forward"].median / timings["cached"].median
    log(f"  encoder {out['every forward']['encoder_s']:.2f} s -> {out['cached']['encoder_s']:.2f} s "
        f"per step (x{out['encoder_speedup']:.2f}); step x{out['step_speedup']:.2f}")
    return out


# ----------------------------------------------------------------------------- all + table -----

def bench_long(*, quick: bool = False, trials: int | None = None, log=print) -> dict:
    if quick:
        return {"sp": bench_sp((8,), group=2, completion=4, trials=1, log=log),
                "micro_batches": bench_micro_batches(group=2, completion=4, trials=1, log=log),
                "encoder_cache": bench_encoder_cache(group=2, completion=4, frames=4, prompts=2,
                                                     trials=1, log=log)}
    log("[bench] long: sequence parallelism, SP=1 vs SP=2")
    sp = bench_sp(trials=trials or 3, log=log)
    log("[bench] long: row-count vs token-budget micro-batches")
    mb = bench_micro_batches(trials=trials or 5, log=log)
    log("[bench] long: frozen encoder cached vs not")
    return {"sp": sp, "micro_batches": mb, "encoder_cache": bench_encoder_cache(trials=trials or 5, log=log)}


def long_tables(r: dict) -> list[str]:
    sp, mb, ec = r["sp"], r["micro_batches"], r["encoder_cache"]
    lines = ["### Long inputs: sequence parallelism, token-budget micro-batches, encoder cache", "",
             f"Tiny-width Qwen2.5-VL ({TINY['hidden_size']} wide, {TINY['num_hidden_layers']} layers), "
             f"{FRAME}x{FRAME} frames, shared-prefix layout on the varlen kernel.", "",
             f"**Sequence parallelism**: forward + backward of one group (G = {sp['group']}, "
             f"completions {sp['completion']} tokens), one thread per process; peak tensor memory "
             f"of the larger rank (the profiler's allocation record, as a GPU's "
             f"max_memory_allocated counts), median time of {sp['trials']} trials.", "",
             "| frames | prompt tokens | SP=1 peak MB | SP=2 peak MB per rank | SP=2 / SP=1 memory "
             "| SP=1 s | SP=2 s | speed-up |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in sp["rows"]:
        lines.append(f"| {row['frames']} | {row['prompt_tokens']} | {row['sp1']['peak_mb']:.0f} | "
                     f"{row['sp2']['peak_mb']:.0f} | {row['memory_ratio']:.2f} | "
                     f"{row['sp1']['median_s']:.2f} | {row['sp2']['median_s']:.2f} | {row['speedup']:.2f}x |")
    lines += ["", f"**Micro-batches** on a mixed batch (prompts of {mb['prompt_tokens']} tokens, "
                  f"G = {mb['group']}, completions up to {mb['completion']} tokens): the update phase "
                  f"through the trainer (`Trainer.learn`: advantages, old logprobs, two update "
                  f"iterations of loss, backward and an optimizer step at lr 1e-30); the token budget is the largest row-count "
                  f"micro-batch, so both hold as much at most. Median of {mb['trials']} "
                  f"interleaved trials.", "",
              "| row count | micro-batches | forwards | largest forward (tokens) | median s | min s "
              "| median CPU s | loss | speed-up (wall / CPU) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cell in mb["cells"]:
        for by, label in (("rows", "rows"), ("tokens", "token budget")):
            m = cell[by]
            lines.append(f"| {cell['rows_per_batch']} | {label} | {m['forwards']} | "
                         f"{m['largest_forward_tokens']} | {m['median_s']:.2f} | {m['min_s']:.2f} | "
                         f"{m['median_cpu_s']:.2f} | {m['loss']:.6f} | "
                         + (f"{cell['speedup']:.2f}x / {cell['cpu_speedup']:.2f}x |" if by == "tokens" else " |"))
    lines += ["", f"**Encoder cache**: a step with num_iterations = 2 and beta > 0 over {ec['prompts']} "
              f"prompts of {ec['frames']} frames, G = {ec['group']}, vision frozen "
              f"({ec['cache_reason']}); median of {ec['trials']} interleaved trials.", "",
              "| vision encoder | encoder s per step | step median s |", "|---|---:|---:|"]
    for name in ("every forward", "cached"):
        lines.append(f"| {name} | {ec[name]['encoder_s']:.2f} | {ec[name]['median_s']:.2f} |")
    lines += ["", f"Cached: encoder time **{ec['encoder_speedup']:.2f}x** lower, step "
                  f"{ec['step_speedup']:.2f}x faster."]
    return lines


if __name__ == "__main__":
    _sp_worker(json.loads(sys.argv[1]))
