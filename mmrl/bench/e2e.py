"""Benchmark 2: one whole GRPO training step, mmrl vs TRL's GRPOTrainer, same everything.

Same tiny Qwen2.5-VL checkpoint (saved once, loaded by both), same images (~1024-token prompts,
nearly all image tokens), G, completion budget, rewards (the `rewards` package's count + format,
weights 1 and 0.5), loss (token-mean = TRL's "dapo"), clip 0.2, beta 0.04 (a reference model on
both sides), lr, temperature 1, HF generate-based rollout on both sides, float32, 2 threads.

Each side runs in its own subprocess (so that its peak RSS is its own), warm-up step(s) first,
and the sides alternate for `rounds` rounds; step times are pooled per side and the median
reported. TRL: `pip install trl==1.16.0` (the `bench` extra).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "How many red squares are there? Answer with <answer>N</answer>."
REWARD_WEIGHTS = {"count": 1.0, "format": 0.5}


def settings(quick: bool) -> dict:
    if quick:
        return dict(prompt_tokens=64, group=2, completion=8, samples=4, steps=2, warmup=1, rounds=1)
    return dict(prompt_tokens=1024, group=8, completion=64, samples=16, steps=4, warmup=1, rounds=2)


def prepare(workdir: Path, prompt_tokens: int, samples: int, seed: int = 0,
            shape: str | None = None) -> dict:
    """Save the tiny model + processor (or, on CUDA, a real-shape model in bfloat16: `shape`, a
    mmrl.models.shapes name) and write the dataset (images + train.jsonl)."""
    import torch
    from PIL import Image, ImageDraw

    from mmrl.bench.common import image_grid
    from mmrl.models import get_adapter, shapes

    workdir.mkdir(parents=True, exist_ok=True)
    adapter = get_adapter("qwen2_5_vl")
    max_pixels = 28 * 28 * prompt_tokens
    if shape:
        model, processor = shapes.build(shape, dtype=torch.bfloat16, device="cuda", seed=seed)
        processor.image_processor.size["longest_edge"] = max_pixels
    else:
        model, processor = adapter.tiny(seed=seed, min_pixels=28 * 28 * 4, max_pixels=max_pixels)
    model.save_pretrained(workdir / "model")
    processor.save_pretrained(workdir / "model")
    rows, cols = image_grid(max(4, prompt_tokens - 30))  # ~30 text tokens in the prompt
    width, height = cols * 28, rows * 28
    rng = random.Random(seed)
    (workdir / "images").mkdir(exist_ok=True)
    records = []
    for i in range(samples):
        count = rng.randint(1, 4)
        im = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(im)
        for q in rng.sample(range(4), count):
            x0 = (q % 2) * width // 2 + rng.randint(0, width // 4)
            y0 = (q // 2) * height // 2 + rng.randint(0, height // 4)
            draw.rectangle([x0, y0, x0 + width // 5, y0 + height // 5], fill=(220, 30, 30))
        name = f"images/{i:04d}.png"
        im.save(workdir / name)
        records.append({"id": f"sq-{i}", "task": "counting", "images": [name], "prompt": QUESTION,
                        "solution": str(count)})
    (workdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"model": str(workdir / "model"), "train": str(workdir / "train.jsonl"),
            "max_pixels": max_pixels, "placeholders": adapter.placeholder_token_ids(processor)}


# ----------------------------------------------------------------------------- sides -----------

def run_mmrl(workdir: Path, s: dict, steps: int, seed: int = 0) -> tuple[list, list]:
    """(per-step (wall s, CPU s), per-step stage times) of the real mmrl Trainer."""
    from mmrl.config import load
    from mmrl.train.loop import Trainer

    overrides = [
        f"data.train={workdir / 'train.jsonl'}", "data.format=mmrl", "data.shuffle=false",
        f"data.image_max_pixels={s['max_pixels']}", "model.family=qwen2_5_vl",
        f"model.path={workdir / 'model'}", "model.attn_implementation=sdpa",
        # On CUDA both sides train in bfloat16 with gradient checkpointing, as the recipes do.
        f"model.dtype={'bfloat16' if s.get('cuda') else 'float32'}",
        f"model.gradient_checkpointing={'true' if s.get('cuda') else 'false'}",
        "rollout.prompts_per_step=1", f"rollout.num_generations={s['group']}",
        f"rollout.max_new_tokens={s['completion']}", "rollout.temperature=1.0",
        "algo.agg=token_mean", "algo.beta=0.04", "algo.clip_low=0.2", "algo.clip_high=0.2",
        f"train.steps={steps}", "train.lr=1e-5", f"train.micro_batch_size={s['group']}",
        f"train.seed={seed}", "train.save_every=0", "eval.before_rl=false",
        "log.tensorboard=false", "log.progress=off", "log.rollouts_every=0",
        # A fresh run dir: an existing one would be resumed (and its saved reference reused).
        f"log.run_dir={tempfile.mkdtemp(prefix='mmrl_run_', dir=workdir)}",
    ]
    overrides += ["train.shared_prefix=true", "rollout.shared_prefill=true"]
    cfg = load(None, overrides + [f"rewards=[{{name: count, weight: {REWARD_WEIGHTS['count']}}}, "
                                  f"{{name: format, weight: {REWARD_WEIGHTS['format']}}}]"])
    trainer = Trainer(cfg)
    trainer.policy.fix_reference()
    times, stages = [], []
    for _ in range(steps):
        start, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.train_step()
        times.append((time.perf_counter() - start, time.process_time() - cpu))
        stages.append({k[len("time/"):]: v for k, v in metrics.items()
                       if k.startswith("time/") and k != "time/tokens_per_s"})
    return times, stages


def run_trl(workdir: Path, s: dict, steps: int, seed: int = 0) -> tuple[list, list]:
    """(per-step (wall s, CPU s), []) of TRL's GRPOTrainer on the same model and data."""
    import datasets
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rewards import get_reward

    records = [json.loads(line) for line in (workdir / "train.jsonl").read_text().splitlines()]
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": r["prompt"]}]}],
             "image": Image.open(workdir / r["images"][0]).convert("RGB"), "solution": r["solution"]}
            for r in records]
    dataset = datasets.Dataset.from_list(rows)

    def wrap(name):
        fn = get_reward(name)

        def reward(prompts, completions, solution, **kwargs):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [0.0 if v is None else v for v in fn(texts, solution)]
        reward.__name__ = name
        return reward

    cuda = bool(s.get("cuda"))
    model = AutoModelForImageTextToText.from_pretrained(
        workdir / "model", dtype="bfloat16" if cuda else "float32", attn_implementation="sdpa")
    processor = AutoProcessor.from_pretrained(workdir / "model")
    args = GRPOConfig(
        output_dir=str(workdir / "trl_run"), per_device_train_batch_size=s["group"],
        num_generations=s["group"], max_completion_length=s["completion"], learning_rate=1e-5,
        beta=0.04, loss_type="dapo", epsilon=0.2, temperature=1.0, max_steps=steps,
        gradient_accumulation_steps=1, logging_steps=10_000, save_strategy="no", report_to=[],
        use_cpu=not cuda, bf16=cuda, gradient_checkpointing=cuda, seed=seed,
        dataloader_num_workers=0, shuffle_dataset=False,
        reward_weights=[REWARD_WEIGHTS[k] for k in REWARD_WEIGHTS],
        generation_kwargs={"suppress_tokens": s["placeholders"]}, disable_tqdm=True)
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.append((time.perf_counter() - self.start, time.process_time() - self.cpu))

    trainer = GRPOTrainer(model=model, reward_funcs=[wrap(k) for k in REWARD_WEIGHTS], args=args,
                          train_dataset=dataset, processing_class=processor, callbacks=[StepTimer()])
    trainer.train()
    return times, []


# ----------------------------------------------------------------------------- driver ----------

def _side_main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("mmrl", "trl"), required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    s = json.loads(args.settings)
    run = run_mmrl if args.side == "mmrl" else run_trl
    times, stages = run(Path(args.workdir), s, args.steps)
    from mmrl.bench.common import peak_rss_bytes

    peak = peak_rss_bytes() / 2**20
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    print("BENCH_RESULT " + json.dumps({"times_s": [t for t, _ in times], "cpu_s": [c for _, c in times],
                                        "stages": stages, "peak_rss_mb": peak,
                                        "peak_cuda_mb": cuda_peak}), flush=True)
    return 0


def _run_side(side: str, workdir: Path, s: dict, steps: int, threads: int, log) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "mmrl.bench.e2e", "--side", side, "--workdir", str(workdir),
           "--settings", json.dumps(s), "--steps", str(steps)] + (
               ["--threads", str(threads)] if threads else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("BENCH_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{side} benchmark failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(line[len("BENCH_RESULT "):])
    log(f"  {side}: steps {[round(t, 2) for t in result['times_s']]} s (CPU "
        f"{[round(t, 2) for t in result['cpu_s']]} s), peak RSS {result['peak_rss_mb']:.0f} MB")
    return result


def bench_e2e(*, quick: bool = False, trials: int | None = None, workdir: str | Path | None = None,
              threads: int | None = None, log=print) -> dict:
    """Benchmark 2. `trials`: measured steps per side per round (warm-up steps excluded)."""
    import torch

    s = settings(quick)
    steps = trials or s["steps"]
    threads = threads or torch.get_num_threads()
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mmrl-bench-e2e-")
        workdir = tmp.name
    workdir = Path(workdir)
    data = prepare(workdir, s["prompt_tokens"], s["samples"])
    side_settings = dict(group=s["group"], completion=s["completion"], max_pixels=data["max_pixels"],
                         placeholders=data["placeholders"])
    pooled = {"mmrl": [], "trl": []}
    peak = {"mmrl": 0.0, "trl": 0.0}
    stages = {"mmrl": [], "trl": []}
    cpu = {"mmrl": [], "trl": []}
    for r in range(s["rounds"]):
        for side in (("mmrl", "trl") if r % 2 == 0 else ("trl", "mmrl")):
            out = _run_side(side, workdir, side_settings, s["warmup"] + steps, threads, log)
            pooled[side] += out["times_s"][s["warmup"]:]
            cpu[side] += out["cpu_s"][s["warmup"]:]
            stages[side] += out.get("stages", [])[s["warmup"]:]
            peak[side] = max(peak[side], out["peak_rss_mb"])
    if tmp is not None:
        tmp.cleanup()
    trainers = {side: {"median_s": statistics.median(pooled[side]), "times_s": pooled[side],
                       "min_s": min(pooled[side]), "median_cpu_s": statistics.median(cpu[side]),
                       "cpu_times_s": cpu[side], "peak_rss_mb": peak[side]} for side in pooled}
    if stages["mmrl"]:  # median seconds per stage of mmrl's step (StageTimer metrics)
        keys = stages["mmrl"][0].keys()
        trainers["mmrl"]["stages_median_s"] = {k: statistics.median(st[k] for st in stages["mmrl"])
                                               for k in keys}
    return {
        "description": (f"Tiny qwen2_5_vl, 1 prompt x G = {s['group']} per step, prompt ~{s['prompt_tokens']} "
                        f"tokens (one image), completions up to {s['completion']} tokens, rewards count + "
                        f"0.5 format, token-mean loss (TRL loss_type=dapo), beta 0.04, clip 0.2, lr 1e-5, "
                        f"HF rollout both sides, {threads} threads; each side in its own process, "
                        f"{s['warmup']} warm-up step(s) dropped, sides alternating over {s['rounds']} rounds. "
                        f"Peak RSS = the process's max resident set (imports included)."),
        "settings": s, "trainers": trainers,
        "speedup": trainers["trl"]["median_s"] / trainers["mmrl"]["median_s"],
        "speedup_min": trainers["trl"]["min_s"] / trainers["mmrl"]["min_s"],
        "speedup_cpu": trainers["trl"]["median_cpu_s"] / trainers["mmrl"]["median_cpu_s"],
    }


if __name__ == "__main__":
    raise SystemExit(_side_main())
