"""Benchmark results -> markdown tables and a scaling plot (PNG)."""
from __future__ import annotations

from pathlib import Path


def _s(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def machine_lines(results: dict) -> list[str]:
    m = results.get("machine", {})
    parts = [m.get("cpu", "?"), f"{m.get('cpus', '?')} cores", f"{m.get('memory_gb', '?')} GB RAM",
             f"torch {m.get('torch', '?')} ({m.get('threads', '?')} threads)",
             f"transformers {m.get('transformers', '?')}", f"Python {m.get('python', '?')}"]
    lines = [f"Machine: {', '.join(str(p) for p in parts)}."]
    if results.get("command"):
        lines.append(f"Command: `{results['command']}`")
    if results.get("load_average") is not None:
        lines.append(f"Load average at start / end (other jobs on the machine): "
                     f"{results['load_average'][0]:.1f} / {results.get('load_average_end', [0])[0]:.1f}")
    return lines


def _mem(r: dict, layout: str) -> str:
    mem = r.get("memory_mb")
    return f"{mem[layout]:.0f}" if mem else "-"


def update_table(r: dict) -> list[str]:
    rows = [("naive G x [prompt, completion]", "naive", r["tokens_naive"]),
            ("shared prefix (packed group)", "shared", r["tokens_shared"])]
    if "varlen" in r:
        rows.append(("shared prefix, varlen kernel (pad-free)", "varlen", r["tokens_shared"]))
    lines = [
        "### 1. Update phase (old + ref logprobs, loss, backward), naive vs shared prefix",
        "",
        f"Tiny {r['family']}, G = {r['group']}, prompt {r['prompt_tokens']} tokens "
        f"({r['image_tokens']} image tokens), completions {r['completion_tokens']} tokens, "
        f"micro-batch {r['micro_batch']} rows (naive) / the same token budget in whole groups "
        f"(shared), {r['trials']} interleaved trials.",
        "",
        "| layout | tokens per group | median s | min s | median CPU s | trials (s) | peak RSS growth (MB) |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for label, key, tokens in rows:
        t = r[key]
        lines.append(f"| {label} | {tokens} | {_s(t['median_s'])} | {_s(t['min_s'])} | "
                     f"{_s(t['median_cpu_s'])} | {', '.join(_s(x) for x in t['times_s'])} | {_mem(r, key)} |")
    lines += ["", f"**Speed-up (median wall): {r['speedup']:.2f}x**; min wall {r['speedup_min']:.2f}x; "
                  f"median CPU {r['speedup_cpu']:.2f}x. Loss naive {r['loss_naive']:.6f}, "
                  f"shared {r['loss_shared']:.6f}."]
    if "varlen" in r:
        a, pad = r["attention_scores"], r["pad_fraction"]
        lines += ["", f"**Varlen kernel: {r['speedup_varlen']:.2f}x over naive** (loss "
                      f"{r['loss_varlen']:.6f}). Attention scores per group, layer and head: naive "
                      f"{a['naive']:,}, dense masked row {a['shared']:,}, varlen {a['varlen']:,} "
                      f"(P^2 + G*C*(P+C)). Pad fraction naive {pad['naive']:.1%}, varlen {pad['varlen']:.1%}."]
    return lines


def scaling_table(r: dict) -> list[str]:
    lines = [
        "### 3. Scaling: update-phase time vs prompt length P and group size G",
        "",
        f"Tiny {r['family']}, completions {r['completion_tokens']} tokens, {r['trials']} "
        f"interleaved trials per cell; seconds are medians (min in brackets).",
        "",
        "| sweep | P (tokens) | G | naive s | shared s | speed-up (median) | speed-up (min) "
        "| speed-up (CPU) | token ratio G(P+C)/(P+GC) | peak RSS growth naive / shared (/ varlen) (MB) "
        "| varlen s | varlen speed-up | attention scores naive / dense / varlen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r["rows"]:
        mem = row.get("memory_mb")
        mem_s = f"{mem['naive']:.0f} / {mem['shared']:.0f}" if mem else "-"
        if mem and "varlen" in mem:
            mem_s += f" / {mem['varlen']:.0f}"
        if "varlen" in row:
            a = row["attention_scores"]
            var_s = (f"{_s(row['varlen']['median_s'])} ({_s(row['varlen']['min_s'])}) | "
                     f"{row['speedup_varlen']:.2f}x | {a['naive']:,} / {a['shared']:,} / {a['varlen']:,}")
        else:
            var_s = "- | - | -"
        lines.append(
            f"| {row['sweep']} | {row['prompt_tokens']} | {row['group']} | "
            f"{_s(row['naive']['median_s'])} ({_s(row['naive']['min_s'])}) | "
            f"{_s(row['shared']['median_s'])} ({_s(row['shared']['min_s'])}) | "
            f"{row['speedup']:.2f}x | {row['speedup_min']:.2f}x | {row.get('speedup_cpu', 0):.2f}x | "
            f"{row['tokens_naive'] / row['tokens_shared']:.2f} | {mem_s} | {var_s} |")
    return lines


def e2e_table(r: dict) -> list[str]:
    lines = [
        "### 2. End-to-end training step: mmrl vs TRL GRPOTrainer",
        "",
        r.get("description", ""),
        "",
        "| trainer | median step s | min s | median CPU s | steps (s) | peak RSS (MB) |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, row in r["trainers"].items():
        lines.append(f"| {name} | {_s(row['median_s'])} | {_s(row['min_s'])} | {_s(row['median_cpu_s'])} | "
                     f"{', '.join(_s(t) for t in row['times_s'])} | {row.get('peak_rss_mb', 0):.0f} |")
    if "speedup" in r:
        lines += ["", f"**mmrl is {r['speedup']:.2f}x faster per step (median wall)**; min wall "
                      f"{r['speedup_min']:.2f}x; median CPU {r['speedup_cpu']:.2f}x."]
    st = r["trainers"].get("mmrl", {}).get("stages_median_s")
    if st:
        lines += ["", "mmrl step by stage (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in st.items())]
    return lines


def headline(results: dict) -> list[str]:
    """Issue #54's two ratios, where this run measured them, against their bars, with what they
    are worth: ratios of one run on this machine, its cores and load named."""
    lines = []
    if "async" in results:
        a = results["async"]
        bar = "met" if a["speedup"] >= 1.3 else "not met"
        learned = ", ".join(f"{k} {'yes' if run['meets_bar'] else 'no'}"
                            for k, run in a["runs"].items())
        lines.append(f"k = 1 / k = 0 RL steps/s (quickstart): x{a['speedup']:.2f} (bar >= 1.3x: "
                     f"{bar}); the learning meets its bar: {learned}")
    if "decode" in results:
        d = results["decode"]
        met = lambda x: "met" if x >= 2 else "not met"  # noqa: E731
        lines.append(f"compiled / eager decode tokens/s (tiny Qwen2.5-VL, bar >= 2x): "
                     f"x{d['speedup']:.2f} over mmrl's eager static-cache loop "
                     f"({met(d['speedup'])}), x{d['speedup_vs_hf_generate']:.2f} over HF "
                     f"generate's decode ({met(d['speedup_vs_hf_generate'])})")
    if lines:
        m, load = results.get("machine", {}), results.get("load_average", [float("nan")])
        end = results.get("load_average_end", load)
        lines.append(f"Ratios of one run on {m.get('cpus', '?')} cores, load {load[0]:.1f} at "
                     f"start and {end[0]:.1f} at end: each side runs after the other, so a "
                     f"load that changes between them moves the ratio (docs/benchmarks.md)"
                     + ("; --quick: tiny sizes, not numbers to report" if results.get("quick")
                        else ""))
    return lines


def markdown(results: dict) -> str:
    lines = ["## Benchmark results", ""] + machine_lines(results) + [""]
    if headline(results):
        lines += [f"- {line}" for line in headline(results)] + [""]
    if "update" in results:
        lines += update_table(results["update"]) + [""]
    if "e2e" in results:
        lines += e2e_table(results["e2e"]) + [""]
    if "rollout" in results:
        from mmrl.bench.rollout import rollout_table

        lines += rollout_table(results["rollout"]) + [""]
    if "decode" in results:
        from mmrl.bench.decode import decode_table

        lines += ["### Decode: eager vs compiled (static KV cache + torch.compile)", ""]
        lines += decode_table(results["decode"]) + [""]
    if "scaling" in results:
        lines += scaling_table(results["scaling"]) + [""]
        if results.get("plot"):
            lines += [f"![scaling]({results['plot']})", ""]
    if "varlen" in results:
        from mmrl.bench.kernels import kernels_table

        lines += kernels_table(results["varlen"]) + [""]
    if "runs" in results:
        from mmrl.bench.runs import runs_table

        lines += runs_table(results["runs"]) + [""]
    if "long" in results:
        from mmrl.bench.long import long_tables

        lines += long_tables(results["long"]) + [""]
    if "async" in results:
        from mmrl.bench.async_bench import async_table

        lines += async_table(results["async"]) + [""]
    return "\n".join(lines)


def plot_scaling(scaling: dict, path: str | Path) -> Path:
    """Two panels: seconds vs P (fixed G) and vs G (fixed P), both layouts, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    rows = scaling["rows"]
    base_g = next((r["group"] for r in rows if r["sweep"] == "P"), None)
    g_rows = [r for r in rows if r["sweep"] == "G"]
    base_p_rows = [r for r in rows if r["sweep"] == "P"]
    # The G sweep also contains the (base P, base G) cell from the P sweep.
    if g_rows:
        base_p = g_rows[0]["prompt_tokens"]
        g_rows = sorted(g_rows + [r for r in base_p_rows if r["prompt_tokens"] == base_p],
                        key=lambda r: r["group"])
    for ax, sweep, key, label in ((axes[0], base_p_rows, "prompt_tokens", "prompt tokens P"),
                                  (axes[1], g_rows, "group", "group size G")):
        xs = [r[key] for r in sweep]
        for layout, style in (("naive", "o-"), ("shared", "s-")):
            ax.plot(xs, [r[layout]["median_s"] for r in sweep], style, label=layout)
        for r in sweep:
            ax.annotate(f"{r['speedup']:.1f}x", (r[key], r["shared"]["median_s"]),
                        textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel(label)
        ax.set_ylabel("update phase, median s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_title(f"vs P (G = {base_g})")
    if g_rows:
        axes[1].set_title(f"vs G (P = {g_rows[0]['prompt_tokens']})")
    fig.suptitle(f"tiny {scaling['family']}: naive vs shared-prefix update phase "
                 f"(completions {scaling['completion_tokens']} tokens)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
