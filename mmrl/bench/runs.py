"""Benchmark "runs": pack sizes under a dense mask. A group packed whole attends over
(P + G*C)^2 scores; with long completions beside a short prompt (tool-use trajectories, whose
observations sit in the completion) that is more than its G naive rows, G (P + C)^2. The
trainer packs each group in runs of `shared_prefix.pack_size` rows (the fewest FLOPs).

    naive   G rows of [prompt, completion]
    whole   one row per group, dense mask (the layout before pack sizes)
    runs    what the trainer runs: the group in runs of pack_size rows, dense mask
    varlen  the varlen kernel (on CPU the prompt / completion split), whole groups

Cells: a tool row's shape (P~32, C=85: visual_search's two-turn trajectories), a longer one
(P~128, C=256) and issue #14's (P~1024, C=64), where runs = whole.
"""
from __future__ import annotations

from mmrl.bench.common import interleaved, tiny_vl
from mmrl.bench.update import UpdateCase
from mmrl.models.shared_prefix import layer_flops, pack_size

LAYOUTS = ("naive", "whole", "runs", "varlen")
CELLS = ((32, 8, 85), (128, 8, 256), (1024, 8, 64))
QUICK_CELLS = ((16, 2, 128), (64, 2, 8))


def bench_runs(*, family: str = "qwen2_5_vl", cells=CELLS, trials: int = 3, model_bundle=None,
               log=print) -> dict:
    """Interleaved trials of the four layouts per cell; one group a micro-batch."""
    bundle = model_bundle or tiny_vl(family, max_image_tokens=max(c[0] for c in cells) * 2)
    rows = []
    for k, (prompt, group, completion) in enumerate(cells):
        case = UpdateCase(*bundle, prompt_tokens=prompt, group=group, completion_tokens=completion)
        losses = {}

        def runner(layout, case=case):
            def fn():
                losses[layout] = case.run(layout, micro_batch=group)
            return fn
        t = interleaved({layout: runner(layout) for layout in LAYOUTS}, trials,
                        warmup=1 if k == 0 else 0)
        row = {"prompt_tokens": case.prompt_len, "group": group, "completion_tokens": completion,
               "pack_size": pack_size(case.prompt_len, [completion - 1] * group,
                                      layer_flops(case.model)),
               **{layout: t[layout].as_dict() for layout in LAYOUTS},
               "losses": dict(losses)}
        rows.append(row)
        log(f"  P={row['prompt_tokens']} G={group} C={completion}: runs of {row['pack_size']}, "
            + ", ".join(f"{layout} {row[layout]['median_s']:.2f} s" for layout in LAYOUTS))
    return {"family": family, "trials": trials, "rows": rows}


def runs_table(r: dict) -> list[str]:
    lines = [
        "### 5. Pack sizes under a dense mask: naive / whole groups / runs / varlen",
        "",
        f"Tiny {r['family']}, one group a micro-batch, update phase (old + ref logprobs, loss, "
        f"backward), {r['trials']} interleaved trial(s) per cell; seconds are medians.",
        "",
        "| P | G | C | runs of | naive s | whole s | runs s | varlen s | whole / runs | naive / runs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        s = {layout: row[layout]["median_s"] for layout in LAYOUTS}
        lines.append(f"| {row['prompt_tokens']} | {row['group']} | {row['completion_tokens']} | "
                     f"{row['pack_size']} | " + " | ".join(f"{s[x]:.2f}" for x in LAYOUTS)
                     + f" | {s['whole'] / s['runs']:.2f}x | {s['naive'] / s['runs']:.2f}x |")
    return lines
