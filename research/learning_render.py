"""Renders the learning table (docs/learning.md and .png) from learning_results.json: the bar's
verdict, a summary a row, every (row, seed) cell, the methods against plain GRPO, the pretext
rows and the findings (findings.md). No training here: learning_table.py runs the rows."""
from __future__ import annotations

import math
import re
from pathlib import Path

from learning_rows import CONTROLS, ENV_CONTROLS, METHODS, PRETEXT, RATES, ROWS, STARTS_FROM

HERE = Path(__file__).resolve().parent


def read_findings(path: Path = HERE / "findings.md") -> dict[str, str]:
    """findings.md's `## row` sections, each joined into one paragraph (a bullet under the table).
    Prose lives in Markdown, where it is read and reviewed, rather than in Python strings."""
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.M)
    return {parts[i].strip(): " ".join(parts[i + 1].split()) for i in range(1, len(parts), 2)}


QUICKSTART = HERE / "learning_quickstart.md"  # the quickstart's seeds, appended to the page
FINDINGS = read_findings()  # rendered under the table, for the rows measured

# How the metric reward is shown: WER is 1 - the `wer` reward, so lower is better.
SHOWN = {"wer": ("WER", lambda v: 1.0 - v), "iou": ("mIoU", None), "tiou": ("mIoU", None),
         "count": ("accuracy", None), "accuracy": ("accuracy", None), "order": ("accuracy", None),
         "jaccard": ("Jaccard", None), "bleu": ("BLEU", None), "success": ("success", None)}
BAR_GAIN, BAR_CHANCE, BAR_WALL_S = 0.15, 0.05, 360.0
BAR_SEEDS = 0.8  # the share of a row's seeds that must meet the bar: 4 of 5
EXACT = ("count", "accuracy", "order")  # exact-match metrics: chance is their majority answer



def verdict(r: dict) -> bool:
    """The bar: the metric reward rises >= 0.15 (for WER that is WER falling >= 0.15), and the
    shuffled-media control ends within 0.05 of chance or no better than before RL. `chance` is
    the majority-answer rate, meaningful for exact-match metrics only (None for IoU/WER/BLEU).
    An environment row (ENV_CONTROLS) has its own control instead of the shuffled media: its
    no-view row, held flat seed by seed in env_lines; here the gain alone.
    Wall time is not part of it: on a shared machine it measures the load as much as the row
    (`wall_ok`, shown beside the load)."""
    before, after, shuf = r["before"], r["after"], r["shuffled"]
    if r.get("row") in ENV_CONTROLS and None not in (before, after):
        return after - before >= BAR_GAIN - 1e-9
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (before, after, shuf)):
        return False
    exact = r["metric"] in EXACT
    near_chance = exact and r["chance"] is not None and abs(shuf - r["chance"]) <= BAR_CHANCE
    # 1e-9: a gain of exactly 0.15 (0.67 -> 0.82) is 0.1499999... in floating point.
    return after - before >= BAR_GAIN - 1e-9 and (near_chance or shuf <= before)


def wall_ok(r: dict) -> bool:
    return r.get("wall_s", float("inf")) <= BAR_WALL_S


def row_meets(runs: list[dict]) -> bool:
    """A row holds when at least BAR_SEEDS of its seeds meet the bar (4 of 5)."""
    return sum(verdict(r) for r in runs if "error" not in r) >= BAR_SEEDS * len(runs) - 1e-9


def _format_note(runs: list[dict]) -> str:
    old = [r for r in runs if not r.get("text_after_scored")]
    if not old:
        return "`format` giving text after `</answer>` 0 (its default now)"
    return ("`format`'s default before it gave text after `</answer>` 0 (text after the answer "
            "earned full format credit under `think: false`)" if len(old) == len(runs) else
            "both `format` defaults (runs before and after it gave text after `</answer>` 0)")


def methods_table(results: list[dict]) -> list[str]:
    """Each method row against its plain-GRPO row, seed by seed (same seed, same eval set, same
    data, same SFT warm-up schedule), and the mean difference over the seeds both have. A method
    is shown on the eval seed of its latest run."""
    ok = {(r["row"], r["seed"], r.get("eval_seed")): r for r in results if "error" not in r}
    lines = ["", "## The seeds' methods against plain GRPO", "",
             "Each method is its recipe row with the method's keys on (docs/methods.md); `bash "
             "research/learning_table.sh --rows methods` runs them. *after* is the held-out "
             "metric after RL; *diff* is method minus plain GRPO on the same seed and eval set; "
             "*rate* is the method's own logged rate, averaged over steps and seeds.", "",
             "| method row | plain row | metric | seeds | eval seed | plain after | method after | "
             "diff | mean diff | rate | plain wall | method wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    measured = []
    for name, (base, _) in METHODS.items():
        mine = current([r for r in results if r["row"] == name and "error" not in r])
        ev = mine[0].get("eval_seed") if mine else None
        seeds = sorted(r["seed"] for r in mine if (base, r["seed"], ev) in ok)
        if not seeds:
            lines.append(f"| {name} | {base} | – | – | – | – | – | – | not measured | – | – | – |")
            continue
        pairs = [(ok[(base, s, ev)], ok[(name, s, ev)]) for s in seeds]
        measured += [x for pair in pairs for x in pair]
        metric = pairs[0][1]["metric"]
        plain, meth = [p["after"] for p, _ in pairs], [m["after"] for _, m in pairs]
        conv = SHOWN.get(metric, (metric, None))[1] or (lambda v: v)
        diffs = [conv(m) - conv(p) for m, p in zip(meth, plain)]  # WER: lower is better
        show = lambda vs: " / ".join(_fmt(v, metric) for v in vs)  # noqa: E731
        lines.append(f"| {name} | {base} | {SHOWN.get(metric, (metric,))[0]} | "
                     f"{', '.join(map(str, seeds))} | {_eval_seed(pairs[0][1])} | {show(plain)} | "
                     f"{show(meth)} | {' / '.join(f'{d:+.2f}' for d in diffs)} | "
                     f"{sum(diffs) / len(diffs):+.2f} | {_rate_text(name, seeds, ev, ok)}"
                     f" | {_mean_wall([p for p, _ in pairs])} | "
                     f"{_mean_wall([m for _, m in pairs])} |")
    if measured:
        lines += ["", f"Measured with {_format_note(measured)}; each plain run beside a method "
                      f"is from the same measurement."]
    return lines


SOURCES = {"photos": "unlabelled photo-like scenes", "videos": "unlabelled clips of a falling ball"}
TRANSFER = {"rotation": " Its transfer to the vqa task is the methods row `vqa+rotation_pretext`."}


def pretext_lines(results: list[dict]) -> list[str]:
    """Pretext tasks have no plain-GRPO row to compare with (without the generator there are no
    labels to train on): their evidence is their own row, before and after RL."""
    lines = []
    for row in PRETEXT:
        runs = [r for r in results if r["row"] == row and "error" not in r]
        if runs:
            show = lambda key: " / ".join(_fmt(r[key], r["metric"]) for r in runs)  # noqa: E731
            lines.append(
                f"- **Pretext task `{row}`** (row `{row}` above): GRPO on `mmrl data generate "
                f"{row} OUT source=FOLDER` from a folder of {SOURCES[PRETEXT[row][0]]}, seeds "
                f"{', '.join(str(r['seed']) for r in runs)}: held-out accuracy {show('before')} "
                f"after the warm-up -> {show('after')} after RL; shuffled media {show('shuffled')}"
                f"; {_mean_wall(runs)} a run. It has no plain-GRPO counterpart: without the "
                f"generator there are no labels.{TRANSFER.get(row, '')}")
    return [""] + lines if lines else []


def _use(r: dict, when: str) -> str:
    use = (r.get("tool_use") or {}).get(when)
    if not use:
        return "–"
    found = "–" if use["found"] is None else f"{use['found']:.0%}"
    return f"{use['called']:.0%} / {found}"


def _paired(results: list[dict], controls: dict[str, str]):
    """(row, control, [(seed, the row's run, the control's run or None)]) for each row of
    `controls` that has runs."""
    ok = {(r["row"], r["seed"]): r for r in results if "error" not in r}
    for row, control in controls.items():
        seeds = sorted(s for (name, s) in ok if name == row)
        if seeds:
            yield row, control, [(s, ok[(row, s)], ok.get((control, s))) for s in seeds]


def tool_lines(results: list[dict]) -> list[str]:
    """Each tool row beside its no-tool control, seed by seed, with tool use before and after RL
    (share of held-out trajectories that called the tool / whose crop held the target)."""
    lines = []
    for row, control, runs in _paired(results, CONTROLS):
        lines += ["", f"## `{row}`: the tool row against its single-turn control", "",
                  f"`{control}` is the same task with no tool offered (single turn); it must stay "
                  f"within {BAR_CHANCE} of chance, and `{row}` must end >= {BAR_GAIN} above it "
                  "(issue #26), besides the usual bar. *Tool use* is the share of held-out "
                  "trajectories that called the tool / whose look held what must be read "
                  "(visual_search: the whole mark, in a crop at most 8x its size; video_search: "
                  "the flash, in the span of frames asked for).",
                  "", "| seed | before | after | no-tool after | chance | shuffled | tool use "
                  "before RL | tool use after RL | bar |", "|---|---|---|---|---|---|---|---|---|"]
        for seed, r, c in runs:
            met = (c is not None and verdict(r) and r["after"] >= c["after"] + BAR_GAIN - 1e-9
                   and abs(c["after"] - c["chance"]) <= BAR_CHANCE)
            lines.append(
                f"| {seed} | {_fmt(r['before'], 'accuracy')} | {_fmt(r['after'], 'accuracy')} | "
                f"{_fmt(c['after'], 'accuracy') if c else '–'} | {_fmt(r['chance'], 'count')} | "
                f"{_fmt(r['shuffled'], 'accuracy')} | {_use(r, 'before')} | {_use(r, 'after')} | "
                f"{'meets' if met else 'misses'} |")
    return lines


def env_lines(results: list[dict]) -> list[str]:
    """Each environment row beside its no-view control, seed by seed: the row must gain >= 0.15
    and the control end within 0.05 of its own before-RL value (issue #58)."""
    lines = []
    for row, control, runs in _paired(results, ENV_CONTROLS):
        lines += ["", f"## `{row}`: the environment row against its no-view control", "",
                  f"`{control}` is the same environment with every view after the first withheld "
                  f"(a grey view after each move: an image, or a clip of two grey frames); it must end within {BAR_CHANCE} of its own "
                  f"before-RL value, and `{row}` must gain >= {BAR_GAIN} (issue #58).", "",
                  "| seed | before | after | control before | control after | bar |",
                  "|---|---|---|---|---|---|"]
        for seed, r, c in runs:
            flat = c is not None and None not in (c["before"], c["after"]) \
                and abs(c["after"] - c["before"]) <= BAR_CHANCE + 1e-9
            lines.append(
                f"| {seed} | {_fmt(r['before'], 'success')} | {_fmt(r['after'], 'success')} | "
                f"{_fmt(c['before'], 'success') if c else '–'} | "
                f"{_fmt(c['after'], 'success') if c else '–'} | "
                f"{'meets' if verdict(r) and flat else 'misses'} |")
    return lines


def _rate_text(name: str, seeds: list[int], ev, ok: dict) -> str:
    """The method's own rate; for a row started from another row's checkpoint, the held-out
    metric that row (the pretext run of the same seed and measurement) reached."""
    if name in STARTS_FROM:
        src = STARTS_FROM[name]
        source = [ok[(src, s, ev)]["after"] for s in seeds if (src, s, ev) in ok]
        return f"{src} after RL {sum(source) / len(source):.2f}" if source else "–"
    rates = [ok[(name, s, ev)]["rate"] for s in seeds
             if ok[(name, s, ev)].get("rate") is not None]
    return f"{RATES[name]} {sum(rates) / len(rates):.2f}" if rates else "–"


def _mean_wall(runs: list[dict]) -> str:
    return f"{sum(r['wall_s'] for r in runs) / len(runs):.0f} s"


def findings(results: list[dict]) -> list[str]:
    """What was found about rows that miss the bar (FINDINGS), for the rows measured."""
    rows = [r for r in FINDINGS if any(x["row"] == r for x in results)]
    if not rows:
        return []
    lines = ["", "## What was found on the way, and why rows miss", "",
             "Numbers below for settings other than a row's own (seed 0) are the same run with "
             "the overrides named in the text: after `bash research/learning_table.sh --rows R "
             "--seeds 0` has written "
             "the data, `mmrl train recipes/R/config.yaml research/layers/R.yaml "
             "data.train=data/learning/R/converted/train.jsonl "
             "data.eval=data/learning/R/converted/eval.jsonl train.seed=0 KEY=VALUE ...` (e.g. "
             "`rollout.temperature=1.0`, `algo.neg_weight=0`, `rollout.top_k=10`); the run's "
             "summary.json holds before / after / shuffled.", ""]
    return lines + [f"- **{r}**: {FINDINGS[r]}" for r in rows]


def _fmt(v, metric: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    conv = SHOWN.get(metric, (metric, None))[1]
    return f"{conv(v) if conv else v:.2f}"


def current(results: list[dict]) -> list[dict]:
    """The table's runs: for each row, the runs on the eval seed of its most recent run. Runs of
    a row on another eval set stay in learning_results.json, for the methods rows measured
    beside them (methods_table pairs runs on the same eval seed)."""
    latest: dict[str, tuple[float, object]] = {}
    for r in results:
        key = (r.get("measured", 0.0), r.get("eval_seed"))
        if r["row"] not in latest or key[0] >= latest[r["row"]][0]:
            latest[r["row"]] = key
    return [r for r in results if r.get("eval_seed") == latest[r["row"]][1]]


def _eval_seed(r: dict) -> str:
    return "train's" if r.get("eval_seed") is None else str(r["eval_seed"])


def _cut_text(r: dict) -> str:
    v = r.get("cut_text")
    return "–" if v is None else f"{v:.0%}"


def summary(results: list[dict]) -> list[str]:
    """One line a row: how many seeds meet the bar, the means, the worst cut-with-text share."""
    lines = ["## Rows at a glance", "",
             f"A row holds when at least {BAR_SEEDS:.0%} of its seeds meet the bar (4 of 5). "
             "Means over its seeds; *cut+text* is the largest share over its seeds.", "",
             "| row | metric | eval seed | seeds | meet the bar | before | after | shuffled | "
             "cut+text | wall (load) | within 6 min | row |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in dict.fromkeys(r["row"] for r in results):
        runs = [r for r in results if r["row"] == row]
        done = [r for r in runs if "error" not in r]
        if not done:
            lines.append(f"| {row} | – | – | {len(runs)} | 0 of {len(runs)} | – | – | – | – | – "
                         f"| – | misses |")
            continue
        metric = done[0]["metric"]
        mean = lambda k: _fmt(_mean([r[k] for r in done]), metric)  # noqa: E731
        cuts = [r["cut_text"] for r in done if r.get("cut_text") is not None]
        load = _mean([r["load"] for r in done if r.get("load") is not None])
        lines.append(
            f"| {row} | {SHOWN.get(metric, (metric,))[0]} | {_eval_seed(done[0])} | "
            f"{', '.join(str(r['seed']) for r in runs)} | "
            f"{sum(verdict(r) for r in done)} of {len(runs)} | {mean('before')} | "
            f"{mean('after')} | {mean('shuffled')} | {f'{max(cuts):.0%}' if cuts else '–'} | "
            f"{_mean_wall(done)} ({_fmt(load, 'load')}) | {sum(wall_ok(r) for r in done)} of "
            f"{len(runs)} | {'holds' if row_meets(runs) else 'misses'} |")
    return lines


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return sum(values) / len(values) if values else None


INTRO = """# Learning table: each recipe learning a tiny task from its media, before and after RL

Each recipe learns a tiny offline task whose answer is only in the media, on a tiny random model
on CPU (2 cores). The task is written in the recipe's anchor format and converted with `mmrl data
convert`; `mmrl train recipes/R/config.yaml research/layers/R.yaml` runs an SFT warm-up, then
GRPO. Metrics are the held-out `mmrl eval` metric reward: *before* RL (after the warm-up),
*after* RL, and after RL with media (images, videos, audio) shuffled across samples
(*shuffled*). *Chance* is the majority-answer rate (exact-match metrics only). *Eval seed* is
the seed the held-out records were drawn from: "train's" is the training data's own draw (the
records generated after the training ones, which the rows were tuned on); a number is a fresh
draw of the task from that seed, records no one has looked at while tuning. *cut+text* is the
share of the sampled completions of the last logged RL step (every completion of that step, in
rollouts.jsonl) cut at `rollout.max_new_tokens` after a whole answer: the policy writing on past
`</answer>`. Bar: gain >= 0.15 (WER: falls >= 0.15) and shuffled within 0.05 of chance or no
better than before RL. Wall time is reported beside *load*, the mean 1-minute load average of
the machine during the run: the machine is shared, and a row that takes 4-5 minutes on idle
cores takes several times that under load, so the 6-minute mark is shown, not part of the bar.

Reproduce: `bash research/learning_table.sh --seeds 0,1,2,3,4 --eval-seed N` (every row, hours)
or `bash research/learning_table.sh --rows counting --seeds 0`. How the rows are built, and the
crutches the tiny models need: research/README.md."""


def write_markdown(results: list[dict], out: Path, png: Path | None) -> None:
    table = current([r for r in results if r["row"] not in METHODS])
    lines = [INTRO, ""] + summary(table) + ["", "## Every run", "",
             "| row | recipe | metric | seed | eval seed | before | after | shuffled | chance | "
             "cut+text | SFT/RL steps | wall | load | bar |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['recipe']} | – | {r['seed']} | {_eval_seed(r)} | – "
                         f"| – | – | – | – | – | {r.get('wall_s', 0):.0f} s | – | failed: "
                         f"{r['error']} |")
            continue
        name = SHOWN.get(r["metric"], (r["metric"], None))[0]
        lines.append(
            f"| {r['row']} | {r['recipe']} | {name} | {r['seed']} | {_eval_seed(r)} | "
            f"{_fmt(r['before'], r['metric'])} | {_fmt(r['after'], r['metric'])} | "
            f"{_fmt(r['shuffled'], r['metric'])} | "
            f"{_fmt(r['chance'], 'count') if r['metric'] in EXACT else '–'} | {_cut_text(r)} | "
            f"{r['sft_steps'] or 0}/{r['rl_steps']} | {r['wall_s']:.0f} s | "
            f"{_fmt(r.get('load'), 'load')} | {'meets' if verdict(r) else 'misses'} |")
    lines += tool_lines(table) + env_lines(table) + methods_table(results) + pretext_lines(table) + findings(results)
    # Measured by hand, not by the harness (the quickstart runs as a user runs it): kept as written.
    lines += ["", QUICKSTART.read_text().rstrip()]
    if png is not None:
        lines += ["", f"![held-out metric reward during RL]({png.name})"]
    out.write_text("\n".join(lines) + "\n")


def plot(results: list[dict], png: Path) -> None:
    """One panel a row, one line a seed: held-out metric reward over RL steps (dotted: shuffled
    media after RL). Rows rebuilt from an older table have no curve: a straight line joins their
    end points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = current(results)
    rows = list(dict.fromkeys(r["row"] for r in results if "error" not in r)) or ["(none)"]
    cols = min(4, len(rows))
    fig, axes = plt.subplots(math.ceil(len(rows) / cols), cols, squeeze=False, sharey=True,
                             figsize=(3.2 * cols, 2.3 * math.ceil(len(rows) / cols)))
    for ax, row in zip(axes.flat, rows):
        runs = [r for r in results if r["row"] == row and "error" not in r]
        for r in runs:
            pts = [(s, v) for s, v in r.get("curve", []) if v is not None]
            if pts and pts[-1][0] < (r.get("rl_steps") or 0) and r.get("after") is not None:
                pts.append((r["rl_steps"], r["after"]))  # no curve kept: its end points
            if pts:
                line, = ax.plot(*zip(*pts), marker=".", label=f"s{r['seed']}")
                if r.get("shuffled") is not None:
                    ax.axhline(r["shuffled"], ls=":", lw=0.8, color=line.get_color())
        metric = SHOWN.get(runs[0]["metric"], (runs[0]["metric"],))[0] if runs else ""
        ax.set_title(f"{row} ({metric} reward)", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=7)
        if runs:
            ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    fig.supxlabel("RL step (0 = after the SFT warm-up); dotted: shuffled media after RL",
                  fontsize=8)
    fig.supylabel("held-out metric reward", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)

