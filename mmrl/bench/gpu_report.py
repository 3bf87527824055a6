"""docs/gpu.md from the GPU check's results (gpu_check.py): one section per stage, each saying
what ran, on what, and what could not run and why."""
from __future__ import annotations

GIB = 2 ** 30


def markdown(r: dict) -> str:
    s, env = r["stages"], r["stages"].get("environment", {})
    title = ("CPU dry run of the GPU check (tiny sizes: these are not GPU numbers)" if r["cpu"]
             else f"Numbers at real size on {env.get('device', 'a GPU')}")
    lines = [f"# {title}", "",
             f"Written by `{r['command']}` on {r['date']} in {r.get('seconds', 0):.0f} s "
             f"(mmrl/bench/gpu_check.py) with {r.get('model', '?')}."
             + ("" if r["cpu"] else " Models are random-weight models of the real shapes "
                "(mmrl/models/shapes.py): they cost what the real checkpoints cost per token; "
                "the tokenizer is a tiny one, the vocabulary size the real one."), ""]
    for name, fn in (("environment", _environment), ("correctness", _correctness),
                     ("update", _update), ("generation", _generation), ("decode", _decode),
                     ("grpo step", _grpo), ("async step", _async), ("trl", _trl),
                     ("recipes", _recipes),
                     ("benchmark", _benchmark)):
        part = s.get(name, {"skipped": "not yet measured" if name == "benchmark" else "not run"})
        lines += [f"## {_TITLES[name]}", ""]
        if "failure" in part:
            lines += [f"Failed: `{part['failure']}`", "", "```", part.get("traceback", ""),
                      "```", ""]
        elif "skipped" in part:
            lines += [f"Not run: {part['skipped']}.", ""]
        elif "pending" in part:  # a stage added after the last lent GPU: what it will measure
            lines += [*part["pending"], ""]
        else:
            lines += fn(part, r) + [""]
        if part.get("note"):  # e.g. a stage run again in its own call
            lines += [part["note"], ""]
    return "\n".join(lines + _AGAIN)


_AGAIN = ["## Measuring again", "",
          "On a GPU machine (offline is fine), with the wheels the image may lack brought along "
          "(`bash scripts/gpu_wheels.sh` on a machine with network first):", "", "```bash",
          "bash scripts/gpu_check.sh                 # rewrites docs/gpu.md and docs/gpu.json",
          'bash scripts/gpu_check.sh --out "$OUT"    # into a folder the machine hands back',
          "bash scripts/gpu_check.sh --cpu           # the same stages at tiny sizes (CI runs it)",
          'bash scripts/gpu_check.sh --out "$OUT" --stages "decode,async step"  # the new rows only',
          "```", "",
          "Stages that would end after `--budget-s` seconds (default 460) are skipped and say so. "
          "With `--stages`, gpu.json holds those stages and the environment: merge them into "
          "docs/gpu.json and render gpu.md from it (`gpu_report.markdown`)."]


_TITLES = {"environment": "Environment", "correctness": "Correctness on the device",
           "update": "Update phase: naive vs shared prefix",
           "generation": "Generation: HF generate vs prefill once",
           "decode": "Decode: eager vs compiled (static KV cache + torch.compile)",
           "grpo step": "One full GRPO step",
           "async step": "The step with rollout.max_staleness k = 0 vs k = 1",
           "trl": "TRL's GRPOTrainer on the same step",
           "recipes": "The recipes' 1-GPU commands: predicted and measured peak",
           "benchmark": "A field benchmark end to end (`mmrl eval --benchmark`)"}


def _environment(e: dict, r: dict) -> list[str]:
    rows = [("device", e["device"]), ("torch", e["torch"]), ("CUDA", e.get("cuda") or "-"),
            ("transformers", e["transformers"]), ("python", e["python"])]
    rows += [(f"kernel: {k}", v) for k, v in e["kernels"].items()]
    rows.append(("shared-prefix varlen path", e["varlen kernel"]))
    if "matmul_tflops" in e:
        rows += [("memory", f"{e['memory_gib']:.1f} GiB"),
                 ("bf16 matmul, 8192^3, measured", f"{e['matmul_tflops']:.0f} TFLOP/s"),
                 ("peak used for MFU", f"{e['peak_tflops']:.0f} TFLOP/s")]
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _correctness(c: dict, r: dict) -> list[str]:
    what = "the tiny twin" if r["cpu"] else "Qwen2.5-VL-3B widths, 2 text layers"
    lines = [f"{what}, {c['dtype']}; one prompt of "
             f"{c['prompt_tokens']} tokens, G = {c['group']}, C = {c['completion']}. Errors are "
             f"against the naive layout in float32 (same weights): logprobs max |diff|, gradients "
             f"the worst relative error over all tensors. Tolerance: the shared layout's error may "
             f"be at most twice the naive layout's own (+1e-4): in bfloat16 both layouts round "
             f"away from float32 and sum in a different order, so a fixed absolute bound would "
             f"measure bfloat16, not the layout.", "",
             "| kernel | logprob err naive | logprob err shared | grad err naive | "
             "grad err shared | within tolerance |", "|---|---:|---:|---:|---:|---|"]
    for k, v in c["kernels"].items():
        lines.append(f"| {k} | {v['naive_logp']:.2e} | {v['shared_logp']:.2e} | "
                     f"{v['naive_grad']:.2e} | {v['shared_grad']:.2e} | "
                     f"{'yes' if v['ok'] else 'NO'} |")
    return lines


def _update(u: dict, r: dict) -> list[str]:
    env, scale = r["stages"]["environment"], r.get("flops_scale", 1.0)
    peak = env.get("peak_tflops")
    layers = r.get("layers")
    gc = "on" if r.get("checkpointing") else "off"
    lines = ["Old and reference logprobs (no grad), then loss and backward per micro-batch "
             f"(mmrl/bench/update.py), gradient checkpointing {gc} (its recompute is not counted "
             "in MFU), micro-batches of 4 rows "
             "(naive) or the same token budget in whole groups. tokens/s: the naive layout's "
             "G x (P + C) tokens over the time (work done, so layouts compare); MFU: the FLOPs "
             "each layout runs (5 forward-equivalents) over time x peak."]
    if layers:
        lines[0] += (f" Measured with {layers['measured']} of {layers['full']} text layers (and "
                     f"the vision tower cut by the same fraction); 'full-depth s' multiplies by "
                     f"the FLOP ratio {scale:.2f}, MFU and ratios are those measured.")
    lines += ["", "| input | P | G | layout | s | full-depth s | tokens/s | MFU | peak GiB | "
              "vs naive |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in u["cells"]:
        naive = row.get("naive", {}).get("seconds")
        for layout in ("naive", "shared", "varlen"):
            v = row.get(layout)
            if v is None:
                continue
            head = f"| {row['kind']} | {row['prompt_tokens']} | {row['group']} | {layout} |"
            if "failure" in v:
                lines.append(f"{head} {v['failure']} | | | | | |")
                continue
            mfu = f"{v['flops'] / v['seconds'] / (peak * 1e12):.1%}" if peak else "-"
            ratio = f"{naive / v['seconds']:.2f}x" if naive else "-"
            lines.append(f"{head} {v['seconds']:.3f} | {v['seconds'] * scale:.3f} | "
                         f"{v['tokens_per_s']:,.0f} | {mfu} | {v['peak_bytes'] / GIB:.1f} | "
                         f"{ratio} |")
    return lines


def _generation(g: dict, r: dict) -> list[str]:
    scale = r.get("flops_scale", 1.0)
    lines = [f"One prompt of {g['prompt_tokens']} tokens, G = {g['group']}, {g['completion']} new "
             f"tokens per row (EOS never sampled), sampling at temperature 1.", "",
             "| mode | s | full-depth s | new tokens/s | peak GiB |", "|---|---:|---:|---:|---:|"]
    names = {"hf_generate": "HF generate (G prefills)", "shared": "prefill once"}
    for mode, label in names.items():
        v = g[mode]
        lines.append(f"| {label} | {v['seconds']:.2f} | {v['seconds'] * scale:.2f} | "
                     f"{v['tokens_per_s']:,.0f} | {v['peak_bytes'] / GIB:.1f} |")
    lines += ["", f"Prefill once: {g['hf_generate']['seconds'] / g['shared']['seconds']:.2f}x."]
    return lines


def _decode(d: dict, r: dict) -> list[str]:
    """The decode stage (bench/decode.py's table: tokens/s, achieved bandwidth, compile)."""
    from mmrl.bench.decode import decode_table

    return decode_table(d)


def _grpo(g: dict, r: dict) -> list[str]:
    st = g["stages"]
    step = st.get("step", sum(v for k, v in st.items() if k != "tokens_per_s"))
    split = ", ".join(f"{k} {v:.2f} s" for k, v in st.items() if k not in ("step", "tokens_per_s"))
    ratio = g["predicted_peak"] / max(1, g["measured_peak"])
    return [f"mmrl's Trainer, {g['model']}: {g['prompts']} prompts x G = {g['group']}, prompts of "
            f"{g['prompt_tokens']} tokens (one image), {g['completion']} new tokens, KL reference, "
            f"HF rollout; median of {g['steps_measured']} step(s) after the first.", "",
            "| | |", "|---|---|",
            f"| seconds per step | {step:.2f} |", f"| split | {split} |",
            f"| tokens/s (trainer's count) | {st.get('tokens_per_s', 0):,.0f} |",
            f"| peak memory, measured | {g['measured_peak'] / GIB:.2f} GiB |",
            f"| peak memory, `mmrl plan` | {g['predicted_peak'] / GIB:.2f} GiB "
            f"({g['predicted_phase']}); predicted / measured = {ratio:.2f} |", "",
            "Overrides: `" + " ".join(g["overrides"]) + "`"]


def _async(a: dict, r: dict) -> list[str]:
    """The async stage (gpu_check.async_step): steps/s at k = 0 and k = 1, and their ratio."""
    lines = [f"The GRPO step's config above, {a['steps']} steps in a fresh process per k "
             f"(docs/async.md: at k = 1 the HF engine samples in its own process from a copy of "
             f"the weights while the trainer updates); steps/s over the {a['steps_timed']} steps "
             f"after the first (each step's wall time).", "",
             "| max_staleness | steps/s | s per step | rollout s (wait at k = 1) | update s |",
             "|---|---:|---:|---:|---:|"]
    for k in (0, 1):
        v = a[f"k{k}"]
        lines.append(f"| {k} | {v['steps_per_s']:.3f} | {1 / v['steps_per_s']:.2f} | "
                     f"{v['rollout_s']:.2f} | {v['update_s']:.2f} |")
    return lines + ["", f"k = 1 over k = 0: x{a['ratio']:.2f} steps/s."]


def _trl(t: dict, r: dict) -> list[str]:
    def best(side):
        times = t[side]["times_s"][1:] or t[side]["times_s"]
        return min(times)
    return [f"TRL {t['trl_version']}, the same model (saved and loaded by both), data, G, "
            f"completion budget, loss (token mean), beta and precision; each side in its own "
            f"process, the first step dropped.", "",
            "| trainer | best step s | peak GiB (CUDA) |", "|---|---:|---:|",
            *[f"| {side} | {best(side):.2f} | "
              f"{(t[side].get('peak_cuda_mb') or 0) / 1024:.1f} |" for side in ("mmrl", "trl")],
            "", f"TRL / mmrl step time: {t['ratio']:.2f}x."]


def _recipes(part: dict, r: dict) -> list[str]:
    """Each recipe README's `train.sh 1` command: the plan's peak (plan_report.one_gpu_rows)
    beside the peak a run at the real shape measured, where one has."""
    lines = ["The plan's peak per GPU (docs/memory.md) of every recipe README's one-GPU command, "
             "and `torch.cuda.max_memory_allocated` over a few steps of that command at the real "
             "shape (random weights).", "",
             "| command | predicted GiB (phase) | measured GiB | measured / predicted |",
             "|---|---:|---:|---:|"]
    for row in part["rows"]:
        measured = row.get("measured_gib")
        lines.append(f"| `{row['command']}` | {row['predicted_gib']:.1f} ({row['phase']}) | "
                     + ("not yet measured | - |" if measured is None else
                        f"{measured:.1f} | {measured / row['predicted_gib']:.2f} |"))
    return lines


def _benchmark(b: dict, r: dict) -> list[str]:
    """The base model at real shape on one benchmark's fixture copy (docs/benchmarks-eval.md)."""
    return ["| | |", "|---|---|", f"| benchmark | {b['benchmark']} ({b['rows']} rows) |",
            f"| seconds | {b['seconds']:.1f} |",
            f"| seconds per row | {b['seconds'] / b['rows']:.2f} |"]
