"""Training curves as PNG plots, one per group of related metrics, overlaying up to N runs.

Every numeric key in metrics.jsonl lands in exactly one plot: the named groups below come first
(the ones a GRPO run is judged by), and whatever is left is grouped by its prefix, so a metric a
future trainer adds still shows up without touching this file.
"""
from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

from mmrl.report.load import Run

# Run i is drawn with line style i; metric j of a plot with colour j. A reader can then tell
# "which run" and "which metric" apart independently in a two-run overlay.
RUN_STYLES = ["-", "--", ":", "-."]
STAGES = ["time/rollout", "time/scoring", "time/logprob", "time/advantage", "time/update",
          "time/sync"]


@dataclass
class CurveGroup:
    title: str
    keys: list[str]
    ylabel: str = ""
    stacked: bool = False  # stage timings: areas that add up to the step time
    bands: bool = False  # draw <key>_std as a shaded band around <key>_mean
    anchor: str = ""  # html id of the plot


def _reward_names(keys: set[str]) -> list[str]:
    names = sorted({m.group(1) for k in keys if (m := re.fullmatch(r"reward/(.+)_mean", k))})
    return [n for n in names if n != "total"]


def _bench_metric(runs: list[Run], key: str) -> str:
    return next((r.benchmark_metrics[key[len("bench/"):]] for r in runs
                 if key[len("bench/"):] in r.benchmark_metrics), "score")


def curve_groups(runs: list[Run]) -> list[CurveGroup]:
    """The plots to draw, in page order, for the union of the runs' numeric metric keys."""
    keys = set().union(*(r.metric_keys for r in runs))
    named = [
        CurveGroup("Total reward", ["reward/total_mean"], "reward", bands=True),
        CurveGroup("Reward per function", [f"reward/{n}_mean" for n in _reward_names(keys)],
                   "reward", bands=True),
        CurveGroup("Eval", sorted(k for k in keys if k.startswith("eval/")), "value"),
        # One panel per field benchmark: before RL, the periodic steps, after RL.
        *[CurveGroup(f"Benchmark: {k[len('bench/'):]}", [k], _bench_metric(runs, k))
          for k in sorted(k for k in keys if k.startswith("bench/"))],
        CurveGroup("Completion length", ["completion/length_mean", "completion/length_max"],
                   "tokens"),
        CurveGroup("Truncated completions", ["completion/truncated_frac",
                                             "completion/cut_after_answer_frac"], "fraction"),
        CurveGroup("KL to reference", ["loss/kl"], "KL"),
        CurveGroup("Entropy", ["entropy"], "nats/token"),
        CurveGroup("Clip fractions", ["loss/clip_frac_low", "loss/clip_frac_high"], "fraction"),
        CurveGroup("Zero-std groups", ["groups/zero_std_frac", "groups/solved_frac", "adv/all_zero"],
                   "fraction"),
        CurveGroup("Time per stage", [k for k in STAGES if k in keys], "seconds", stacked=True),
        CurveGroup("Step time", ["time/step", "time/benchmarks"], "seconds"),  # + the benchmarks
        CurveGroup("Throughput", ["time/tokens_per_s", "speed/generated_tokens_per_s"],
                   "tokens/s"),
        CurveGroup("Rollout: prefill and decode", ["time/rollout_prefill", "time/rollout_decode"],
                   "seconds", stacked=True),
        CurveGroup("Decode bandwidth and update MFU", ["speed/decode_bandwidth_share",
                                                       "speed/update_mfu"], "fraction of peak"),
        CurveGroup("Loss", ["loss/loss"], "loss"),
        CurveGroup("Importance ratio", ["loss/ratio_mean", "loss/ratio_min", "loss/ratio_max"],
                   "ratio"),
        CurveGroup("Advantage", ["adv/mean", "adv/std", "adv/abs_mean"], "advantage"),
        CurveGroup("Gradient norm", ["grad_norm"], "norm"),
        CurveGroup("Learning rate", ["lr"], "lr"),
        CurveGroup("Sampling rounds", ["sampling/rounds"], "rounds"),
        CurveGroup("Skipped samples", ["data/skipped"], "count"),
    ]
    groups, used = [], set()
    for g in named:
        g.keys = [k for k in g.keys if k in keys]
        used.update(g.keys)
        if g.bands:  # the std keys are drawn as the bands of their means
            used.update(k[: -len("_mean")] + "_std" for k in g.keys)
        if g.keys:
            groups.append(g)
    leftovers: dict[str, list[str]] = {}
    for k in sorted(keys - used):
        leftovers.setdefault(k.split("/")[0], []).append(k)
    groups += [CurveGroup(f"Other: {prefix}", ks) for prefix, ks in leftovers.items()]
    for g in groups:
        g.anchor = "curve-" + re.sub(r"[^a-z0-9]+", "-", g.title.lower()).strip("-")
    return groups


def _series(run: Run, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) where the value is a finite number: null and NaN rows are gaps, and
    eval metrics logged every k steps become a sparse series instead of a line through zeros."""
    xs, ys = [], []
    for row in sorted(run.metrics + run.benchmarks, key=lambda r: r.get("step") or 0):
        v, s = row.get(key), row.get("step")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                and isinstance(s, (int, float)):
            xs.append(float(s))
            ys.append(float(v))
    return xs, ys


def _short(key: str, group: CurveGroup) -> str:
    if group.title == "Reward per function" and key.startswith("reward/"):
        return key[len("reward/"):-len("_mean")]
    return key


def plot_group(runs: list[Run], group: CurveGroup) -> tuple[bytes, list[str]]:
    """One PNG for `group` over all `runs`, and the legend labels drawn in it.

    Labels are "<metric>" for one run and "<run>: <metric>" for several, so the legend of an
    overlay names every run (tests check exactly that).
    """
    from matplotlib.figure import Figure  # object API: no pyplot global state

    fig = Figure(figsize=(5.2, 3.0), dpi=100)
    if group.stacked and len(runs) > 1:  # stacked areas do not overlay: one panel per run
        axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    else:
        axes = [fig.subplots()] * len(runs)
    labels: list[str] = []
    for i, (run, ax) in enumerate(zip(runs, axes)):
        prefix = f"{run.name}: " if len(runs) > 1 else ""
        if group.stacked:
            labels += _plot_stacked(ax, run, group, prefix)
        else:
            labels += _plot_lines(ax, run, group, prefix, RUN_STYLES[i % len(RUN_STYLES)])
    for ax in set(axes):
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(group.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7, loc="best", framealpha=0.8)
    fig.suptitle(group.title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue(), labels


def _plot_lines(ax, run: Run, group: CurveGroup, prefix: str, style: str) -> list[str]:
    labels = []
    for j, key in enumerate(group.keys):
        xs, ys = _series(run, key)
        if not xs:
            continue
        colour = f"C{j % 10}"
        label = prefix + _short(key, group)
        # Sparse series (eval every k steps) get markers: a line alone hides how few points exist.
        sparse = len(xs) < 0.5 * max(1, len(run.metrics)) or len(xs) < 3
        ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.3,
                marker="o" if sparse else None, markersize=3)
        labels.append(label)
        if group.bands and key.endswith("_mean"):
            sx, sd = _series(run, key[: -len("_mean")] + "_std")
            by_step = dict(zip(sx, sd))
            pts = [(x, y, by_step[x]) for x, y in zip(xs, ys) if x in by_step]
            if pts:
                bx, by, bs = zip(*pts)
                ax.fill_between(bx, [y - s for y, s in zip(by, bs)],
                                [y + s for y, s in zip(by, bs)], color=colour, alpha=0.12,
                                linewidth=0)
    return labels


def _plot_stacked(ax, run: Run, group: CurveGroup, prefix: str) -> list[str]:
    """Stage timings stacked per step: steps missing any stage are dropped so the areas align."""
    per_key = {k: dict(zip(*_series(run, k))) for k in group.keys}
    steps = sorted(set.intersection(*(set(v) for v in per_key.values()))) if per_key else []
    if not steps:
        return []
    labels = [prefix + k.split("/", 1)[1] for k in group.keys]
    ax.stackplot(steps, [[per_key[k][s] for s in steps] for k in group.keys], labels=labels,
                 alpha=0.85)
    xs, ys = _series(run, "time/step")
    if xs:  # the measured step time on top shows what the stages do not account for
        ax.plot(xs, ys, "k-", linewidth=0.8, label=prefix + "step total")
        labels.append(prefix + "step total")
    if prefix:
        ax.set_title(prefix.rstrip(": "), fontsize=8)
    return labels
