"""Benchmark "varlen": the update phase in the three layouts at the cells issue #14 sets targets
for, peak memory beside time.

    naive   G rows of [prompt, completion]
    shared  one row per group, dense (P+GC)^2 boolean mask (sdpa)
    varlen  mmrl_prefix_varlen: every group of a micro-batch in one pad-free row; on GPU
            flash_attn_varlen_func, on CPU the prompt / completion split merged by log-sum-exp

Cells: P~1024 G=8 (target >= 5x), the same with ragged completions, P~1024 G=16 (target >= 10x),
P~2048 G=16 (attention memory: the varlen path must grow as P^2 + G*C*(P+C), below the dense row).
"""
from __future__ import annotations

from mmrl.bench.common import tiny_vl
from mmrl.bench.update import LAYOUTS, measure_cell

CELLS = ((1024, 8, False), (1024, 8, True), (1024, 16, False), (2048, 16, False))
QUICK_CELLS = ((64, 2, False), (64, 2, True), (64, 3, False))


def bench_kernels(*, family: str = "qwen2_5_vl", cells=CELLS, completion_tokens: int = 64,
                  trials: int = 3, micro_batch: int = 8, model_bundle=None, memory: bool = True,
                  log=print) -> dict:
    """Interleaved trials of the three layouts per cell (+ each layout's peak RSS growth in a
    fresh process when `memory`)."""
    bundle = model_bundle or tiny_vl(family, max_image_tokens=max(c[0] for c in cells) * 2)
    rows = []
    for k, (prompt, group, uneven) in enumerate(cells):
        row = {"uneven": uneven,
               **measure_cell(bundle, family=family, prompt_tokens=prompt, group=group,
                              completion_tokens=completion_tokens, trials=trials,
                              micro_batch=micro_batch, memory=memory, uneven=uneven,
                              warmup=1 if k == 0 else 0)}
        rows.append(row)
        log(f"  P={row['prompt_tokens']:5d} G={group:3d}{' ragged' if uneven else ''}: "
            f"naive {row['naive']['median_s']:.2f} s, shared x{row['speedup']:.2f}, "
            f"varlen x{row['speedup_varlen']:.2f}")
    return {"family": family, "micro_batch": micro_batch, "trials": trials,
            "completion_tokens": completion_tokens, "rows": rows}


def kernels_table(r: dict) -> list[str]:
    lines = [
        "### 4. The varlen kernel: update phase in the three layouts",
        "",
        f"Tiny {r['family']}, completions C = {r['completion_tokens']} tokens (ragged: C in "
        f"[C/2, C]), micro-batch {r['micro_batch']} rows (naive) / the same token budget in whole "
        f"groups, {r['trials']} interleaved trial(s) per cell; seconds are medians.",
        "",
        "| P | G | naive s | shared (dense mask) s | varlen s | shared / naive | varlen / naive "
        "| attention scores per group, layer, head: naive / dense / varlen "
        "| peak RSS growth naive / shared / varlen (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in r["rows"]:
        a, mem = row["attention_scores"], row.get("memory_mb")
        mem_s = " / ".join(f"{mem[layout]:.0f}" for layout in LAYOUTS) if mem else "-"
        lines.append(
            f"| {row['prompt_tokens']} | {row['group']}{', ragged' if row['uneven'] else ''} | "
            f"{row['naive']['median_s']:.2f} | {row['shared']['median_s']:.2f} | "
            f"{row['varlen']['median_s']:.2f} | {row['speedup']:.2f}x | {row['speedup_varlen']:.2f}x | "
            f"{a['naive']:,} / {a['shared']:,} / {a['varlen']:,} | {mem_s} |")
    return lines
