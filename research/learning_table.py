"""The learning table (docs/learning.md): every recipe learns a tiny offline task from its media.

For each row: write the task in the recipe's anchor format (mmrl.data.anchor_tasks), convert it
with `mmrl data convert --from FORMAT` (a subprocess, as a user runs it), train with
`mmrl train recipes/R/config.yaml research/layers/R.yaml` (SFT warm-up, then GRPO) and read
summary.json: the held-out metric before RL, after RL, and after RL with the media shuffled
across samples. Rows run one after another (the machine is small and shared).

    bash research/learning_table.sh [--rows counting,detection] [--seeds 0,1,2] [--render-only]

Research, not product: nothing under mmrl/ or rewards/ imports this folder (research/README.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "research"
sys.path.insert(0, str(ROOT))


def read_findings(path: Path = HERE / "findings.md") -> dict[str, str]:
    """findings.md's `## row` sections, each joined into one paragraph (a bullet under the table).
    Prose lives in Markdown, where it is read and reviewed, rather than in Python strings."""
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.M)
    return {parts[i].strip(): " ".join(parts[i + 1].split()) for i in range(1, len(parts), 2)}


FINDINGS = read_findings()  # rendered under the table, for the rows measured

# row -> (recipe, extra overrides). The metric is the recipe's eval.metric_reward.
ROWS: dict[str, tuple[str, list[str]]] = {
    "counting": ("counting", []),
    "detection": ("detection", []),
    "temporal_grounding": ("temporal_grounding", []),
    "asr": ("asr", []),
    "vqa": ("vqa", []),
    "classification": ("classification", []),
    "video_qa": ("video_qa", []),
    "audio_qa": ("audio_qa", []),
    "captioning": ("captioning", []),
    "counting_qwen2_vl": ("counting", ["model.family=qwen2_vl"]),
    # Seed 0 (warmed up to 0.67) stopped at 0.75 (three counts of four) after 200 and after 300
    # steps at temperature 1, where the trainer warned that samples scored below greedy; at 0.7
    # (the asr fix) it reaches 1.0 by step 300.
    "counting_qwen3_vl": ("counting", ["model.family=qwen3_vl", "train.steps=300",
                                       "rollout.temperature=0.7"]),
    "audio_visual": ("audio_visual", []),  # Qwen2.5-Omni (thinker): video and audio
    # 200 training prompts: 150 steps x 8 prompts are 6 passes, so a prompt's history (which
    # spans passes) has visits to remember; the plain row for history filtering.
    "vqa_200": ("vqa", ["data.max_samples=200"]),
    # A pretext task (docs/methods.md, pretext tasks): `mmrl data generate rotation` on a
    # folder of photo-like scenes (PRETEXT), trained with the vqa recipe's accuracy reward.
    "rotation": ("vqa", []),
    # The same for videos: `mmrl data generate temporal_jigsaw` (2 clips: in order or swapped)
    # on a folder of clips of a falling ball, trained with the video_qa recipe on `order`.
    "temporal_jigsaw": ("video_qa", [
        "rewards=[{name: order, weight: 1.0}, {name: format, weight: 0.1, params: {think: false}}]",
        "eval.metric_reward=order", "rollout.max_new_tokens=12", "data.video_fps=2",
        # Two orders: at 0.4 the warm-up stopped on a constant answer. Checked every 2 steps:
        # val accuracy leaps from 0.5 to 1.0 within 10 steps once the order is read.
        "sft.stop_accuracy=0.6", "sft.eval_every=2"]),
    # `mmrl data generate clip_counting`: 1-3 clips of those videos joined, how many?
    "clip_counting": ("video_qa", [
        "rewards=[{name: count, weight: 1.0}, {name: format, weight: 0.1, params: {think: false}}]",
        "eval.metric_reward=count", "data.video_fps=2", "sft.stop_accuracy=0.6",
        "sft.eval_every=2"]),
}
# Rows whose data is a pretext task built from a folder of unlabelled media, as a user runs it
# (`mmrl data generate TASK OUT source=FOLDER`), instead of the recipe's anchor task:
# row -> (folder painted as the user's media: "photos" or "videos", generator arguments).
PRETEXT = {"rotation": ("photos", {"size": 56, "n_train": 600, "n_eval": 100}),
           "temporal_jigsaw": ("videos", {"size": 56, "n_train": 1000, "n_eval": 100,
                                          "clips": 2, "frames_per_clip": 2, "fps": 2}),
           "clip_counting": ("videos", {"size": 56, "n_train": 1000, "n_eval": 100,
                                        "max_clips": 3, "frames_per_clip": 2, "fps": 2})}
# The seeds' methods (docs/methods.md), each a row on top of a recipe row and
# compared with it seed by seed: method row -> (plain GRPO row, overrides).
METHODS: dict[str, tuple[str, list[str]]] = {
    # TTRL / MM-UPT: no labels in RL. TTRL's plain majority: with min_agreement 0.5 a majority
    # seldom formed after the warm-up, the format reward alone drove RL, and accuracy fell to 0.
    "counting+majority_vote": ("counting", [
        "rewards=[{name: majority_vote, weight: 1.0, params: {min_agreement: 0.0}},"
        " {name: format, weight: 0.1, params: {think: false}}]"]),
    # One uninformative group is enough to skip (k = 1), on the 200-prompt row: with the 1000
    # prompts of the vqa row a 150-step run drew most prompts once, and the filter never fired.
    "vqa+history_skip": ("vqa_200", ["algo.history_epochs=1", "algo.history_mode=skip"]),
    # No-Thinking-CLS-RL / TON: half the prompts ask for thinking, half forbid it; the warm-up
    # imitates a (fixed) think block where asked, or the policy never opens one.
    "counting+think_hybrid": ("counting", [
        "data.think_hybrid=0.5", "rewards=[{name: count, weight: 1.0},"
        " {name: think_format, weight: 0.1}]",
        "sft.think_target='<think>I count the red squares.</think><answer>{solution}</answer>'",
        "rollout.max_new_tokens=24"]),
    "temporal_grounding+gt_guidance": ("temporal_grounding", ["algo.gt_threshold=0.5"]),
    # Video order: temporal grounding needs it (when is the square visible; its first reward,
    # tiou, is T-GRPO's accuracy), and so does video_qa's colour order.
    "temporal_grounding+tgrpo": ("temporal_grounding", ["algo.tgrpo_alpha=0.3"]),
    "video_qa+tgrpo": ("video_qa", ["algo.tgrpo_alpha=0.3"]),  # which colour comes first
    # Spatial-SSRL / SSL4RL: RL on a pretext task first, then the task. The vqa row starts from
    # the rotation row's final checkpoint of the same seed (STARTS_FROM) instead of the random
    # tiny model; both rows answer with an option letter.
    "vqa+rotation_pretext": ("vqa", []),
}
# Method rows that start from another row's final checkpoint (run first when missing).
STARTS_FROM = {"vqa+rotation_pretext": "rotation"}
# Each method's own logged rate (metrics.jsonl), averaged over the run's steps.
RATES = {"counting+majority_vote": "label_free/majority_wrong", "vqa+history_skip":
         "history/kept_frac", "counting+think_hybrid": "think/think",
         "temporal_grounding+gt_guidance": "gt_guidance/fired_frac",
         "temporal_grounding+tgrpo": "tgrpo/win_frac", "video_qa+tgrpo": "tgrpo/win_frac"}
for _name, (_base, _extra) in METHODS.items():
    ROWS[_name] = (ROWS[_base][0], ROWS[_base][1] + _extra)
GROUPS = {"recipes": [r for r in ROWS if r not in METHODS], "methods": list(METHODS)}
# How the metric reward is shown: WER is 1 - the `wer` reward, so lower is better.
SHOWN = {"wer": ("WER", lambda v: 1.0 - v), "iou": ("mIoU", None), "tiou": ("mIoU", None),
         "count": ("accuracy", None), "accuracy": ("accuracy", None), "order": ("accuracy", None),
         "jaccard": ("Jaccard", None), "bleu": ("BLEU", None)}
BAR_GAIN, BAR_CHANCE, BAR_WALL_S = 0.15, 0.05, 360.0
EXACT = ("count", "accuracy", "order")  # exact-match metrics: chance is their majority answer


def _mmrl(args: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    with log.open("a") as f:
        proc = subprocess.run([sys.executable, "-c", "import sys; from mmrl.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", *args], cwd=ROOT, env=env,
                              stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = "".join(log.read_text().splitlines(True)[-15:])
        raise RuntimeError(f"mmrl {' '.join(args[:2])} failed (rc {proc.returncode}); {log}:\n{tail}")


def prepare_pretext(task: str, data_root: Path, log: Path) -> tuple[Path, Path]:
    """A pretext task from a folder of unlabelled photo-like scenes (synthetic.paint_scenes) or
    clips of a falling ball (synthetic_av.paint_falling), written by `mmrl data generate TASK OUT
    source=FOLDER`. Deterministic, cached."""
    from mmrl.data.synthetic import paint_scenes
    from mmrl.data.synthetic_av import paint_falling

    out = data_root / task
    if not (out / "eval.jsonl").exists():
        kind, args = PRETEXT[task]
        # As many as records: rotation and temporal_jigsaw take one each, so the held-out ones
        # are unseen (clip_counting joins clips of any).
        paint = {"photos": paint_scenes, "videos": paint_falling}[kind]
        paint(data_root / kind, n=args["n_train"] + args["n_eval"])
        _mmrl(["data", "generate", task, str(out), f"source={data_root / kind}",
               *(f"{k}={v}" for k, v in args.items())], log)
    return out / "train.jsonl", out / "eval.jsonl"


def prepare(recipe: str, data_root: Path, log: Path) -> tuple[Path, Path]:
    """Anchor-format task files, converted to native JSONL by the CLI. Deterministic, cached."""
    from mmrl.data import anchor_tasks
    from mmrl.data.synthetic import GENERATORS

    out = data_root / recipe
    conv = {s: out / "converted" / f"{s}.jsonl" for s in ("train", "eval")}
    if all(p.exists() for p in conv.values()):
        return conv["train"], conv["eval"]
    made = GENERATORS.get(f"anchor_{recipe}")(out)
    assert made["format"] == anchor_tasks.ANCHORS[recipe][2]
    for split, path in conv.items():
        _mmrl(["data", "convert", "--from", made["format"], made[split], str(path)], log)
    return conv["train"], conv["eval"]


def _curve(run_dir: Path) -> list[tuple[int, float]]:
    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            points.append((int(m["step"]), float(m["eval/accuracy"])))
    return points


def _rate(run_dir: Path, key: str | None) -> float | None:
    if key is None:
        return None
    values = [m[key] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    return sum(values) / len(values) if values else None


def _run_dir(row: str, seed: int, runs_root: Path) -> Path:
    return runs_root / f"{row.replace('+', '_')}_s{seed}"


def _final_checkpoint(row: str, seed: int, data_root: Path, runs_root: Path) -> Path:
    """The last complete checkpoint of `row` at `seed`, running the row first when it has none."""
    from mmrl.train import checkpoint

    run_dir = _run_dir(row, seed, runs_root)
    if checkpoint.latest(run_dir) is None:
        run_row(row, seed, data_root, runs_root)
    found = checkpoint.latest(run_dir)
    if found is None:
        raise RuntimeError(f"{row} seed {seed} saved no checkpoint under {run_dir}")
    return found


def run_row(row: str, seed: int, data_root: Path, runs_root: Path) -> dict:
    recipe, extra = ROWS[row]
    if row in STARTS_FROM:
        start = _final_checkpoint(STARTS_FROM[row], seed, data_root, runs_root)
        extra = extra + [f"model.path={start}"]
    run_dir = _run_dir(row, seed, runs_root)
    shutil.rmtree(run_dir, ignore_errors=True)  # measured again: the new run replaces the old
    run_dir.mkdir(parents=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    log.write_text("")
    train, evalf = (prepare_pretext(row, data_root, log) if row in PRETEXT
                    else prepare(recipe, data_root, log))
    cfg = [f"recipes/{recipe}/config.yaml", f"research/layers/{recipe}.yaml"]
    started = time.perf_counter()
    _mmrl(["train", *cfg, f"data.train={train}", f"data.eval={evalf}", f"train.seed={seed}",
           f"log.run_dir={run_dir}", f"name=learn_{run_dir.name[:-len(f'_s{seed}')]}", *extra], log)
    wall = time.perf_counter() - started
    load = os.getloadavg()[1]  # 5-min load average: the machine is shared, wall times vary
    summary = json.loads((run_dir / "summary.json").read_text())
    from mmrl import config
    metric = config.load(str(ROOT / cfg[0]), [str(ROOT / cfg[1]), *extra]).eval.metric_reward
    return {"row": row, "recipe": recipe, "seed": seed, "metric": metric, "wall_s": wall,
            "load": load,
            "before": summary.get("accuracy_before_rl"), "after": summary.get("accuracy_after_rl"),
            "shuffled": summary.get("accuracy_shuffled_images"), "chance": summary.get("chance"),
            "sft_steps": (summary.get("sft") or {}).get("steps"), "rl_steps": summary.get("steps"),
            "rate": _rate(run_dir, RATES.get(row)),
            "curve": [(0, summary.get("accuracy_before_rl"))] + _curve(run_dir)}


def verdict(r: dict) -> bool:
    """The bar: the metric reward rises >= 0.15 (for WER that is WER falling >= 0.15), and the
    shuffled-media control ends within 0.05 of chance or no better than before RL. `chance` is
    the majority-answer rate, meaningful for exact-match metrics only (None for IoU/WER/BLEU)."""
    before, after, shuf = r["before"], r["after"], r["shuffled"]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (before, after, shuf)):
        return False
    exact = r["metric"] in EXACT
    near_chance = exact and r["chance"] is not None and abs(shuf - r["chance"]) <= BAR_CHANCE
    # 1e-9: a gain of exactly 0.15 (0.67 -> 0.82) is 0.1499999... in floating point.
    return (after - before >= BAR_GAIN - 1e-9 and (near_chance or shuf <= before)
            and r["wall_s"] <= BAR_WALL_S)


def methods_table(results: list[dict]) -> list[str]:
    """Each method row against its plain-GRPO row, seed by seed (same seed, same data, same SFT
    warm-up schedule), and the mean difference over the seeds both have."""
    ok = {(r["row"], r["seed"]): r for r in results if "error" not in r}
    lines = ["", "## The seeds' methods against plain GRPO", "",
             "Each method is its recipe row with the method's keys on (docs/methods.md); `bash research/learning_table.sh --rows methods` runs them. *after* is the "
             "held-out metric after RL; *diff* is method minus plain GRPO on the same seed; *rate* "
             "is the method's own logged rate, averaged over steps and seeds.", "",
             "| method row | plain row | metric | seeds | plain after | method after | diff | "
             "mean diff | rate | plain wall | method wall |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (base, _) in METHODS.items():
        seeds = sorted(s for (row, s) in ok if row == name and (base, s) in ok)
        if not seeds:
            lines.append(f"| {name} | {base} | – | – | – | – | – | not measured | – | – | – |")
            continue
        metric = ok[(name, seeds[0])]["metric"]
        plain = [ok[(base, s)]["after"] for s in seeds]
        meth = [ok[(name, s)]["after"] for s in seeds]
        diffs = [m - p for m, p in zip(meth, plain)]
        conv = SHOWN.get(metric, (metric, None))[1]
        if conv:  # WER: lower is better, the difference flips sign with it
            diffs = [conv(m) - conv(p) for m, p in zip(meth, plain)]
        show = lambda vs: " / ".join(_fmt(v, metric) for v in vs)  # noqa: E731
        lines.append(f"| {name} | {base} | {SHOWN.get(metric, (metric,))[0]} | "
                     f"{', '.join(map(str, seeds))} | {show(plain)} | {show(meth)} | "
                     f"{' / '.join(f'{d:+.2f}' for d in diffs)} | "
                     f"{sum(diffs) / len(diffs):+.2f} | {_rate_text(name, seeds, ok)}"
                     f" | {_mean_wall([ok[(base, s)] for s in seeds])} | "
                     f"{_mean_wall([ok[(name, s)] for s in seeds])} |")
    return lines + pretext_lines(ok)


SOURCES = {"photos": "unlabelled photo-like scenes", "videos": "unlabelled clips of a falling ball"}
TRANSFER = {"rotation": " Its transfer to the vqa task is the methods row `vqa+rotation_pretext`."}


def pretext_lines(ok: dict) -> list[str]:
    """Pretext tasks have no plain-GRPO row to compare with (without the generator there are no
    labels to train on): their evidence is their own row, before and after RL."""
    lines = []
    for row in PRETEXT:
        runs = [ok[k] for k in sorted(ok) if k[0] == row]
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


def _rate_text(name: str, seeds: list[int], ok: dict) -> str:
    """The method's own rate; for a row started from another row's checkpoint, the held-out
    metric that row (the pretext run) reached."""
    if name in STARTS_FROM:
        src = STARTS_FROM[name]
        source = [ok[(src, s)]["after"] for s in seeds if (src, s) in ok]
        return f"{src} after RL {sum(source) / len(source):.2f}" if source else "–"
    rates = [ok[(name, s)]["rate"] for s in seeds if ok[(name, s)].get("rate") is not None]
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


def write_markdown(results: list[dict], out: Path, png: Path | None) -> None:
    lines = [
        "# Learning table: each recipe learning a tiny task from its media, before and after RL",
        "",
        "Each recipe learns a tiny offline task whose answer is only in the media, on a tiny",
        "random model on CPU (2 cores). The task is written in the recipe's anchor format and",
        "converted with `mmrl data convert`; `mmrl train recipes/R/config.yaml research/layers/R.yaml`",
        "runs an SFT warm-up, then GRPO. Metrics are the held-out `mmrl eval` metric reward:",
        "*before* RL (after the warm-up), *after* RL, and after RL with media (images, videos,",
        "audio) shuffled across samples (*shuffled*). *Chance* is the majority-answer rate (exact-",
        "match metrics only). Bar: gain >= 0.15 (WER: falls >= 0.15) and shuffled within 0.05 of",
        "chance or no better than before RL, in <= 6 min wall on 2 cores. *load* is the 5-min load",
        "average at the run's end: on a shared machine wall time grows with it.",
        "",
        "Reproduce: `bash research/learning_table.sh` (all rows, seeds 0 1 2) or "
        "`bash research/learning_table.sh --rows counting --seeds 0`. How the rows are built, "
        "and the crutches the tiny models need: research/README.md.",
        "",
        "| row | recipe | metric | seed | before | after | shuffled | chance | SFT/RL steps | wall | load | bar |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['recipe']} | – | {r['seed']} | – | – | – | – | – | "
                         f"{r.get('wall_s', 0):.0f} s | – | failed: {r['error']} |")
            continue
        name = SHOWN.get(r["metric"], (r["metric"], None))[0]
        lines.append(
            f"| {r['row']} | {r['recipe']} | {name} | {r['seed']} | {_fmt(r['before'], r['metric'])}"
            f" | {_fmt(r['after'], r['metric'])} | {_fmt(r['shuffled'], r['metric'])} | "
            f"{_fmt(r['chance'], 'count') if r['metric'] in EXACT else '–'} | "
            f"{r['sft_steps'] or 0}/{r['rl_steps']} | {r['wall_s']:.0f} s | "
            f"{_fmt(r.get('load'), 'load')} | {'meets' if verdict(r) else 'misses'} |")
    lines += methods_table(results) + findings(results)
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


def _order(r: dict) -> tuple[int, int]:
    return (list(ROWS).index(r["row"]) if r["row"] in ROWS else len(ROWS), r["seed"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS),
                   help="rows or groups (recipes, methods), comma-separated; default all")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=str(ROOT / "docs"), help="folder for learning.md and .png")
    p.add_argument("--data", default=str(ROOT / "data" / "learning"))
    p.add_argument("--runs", default=str(ROOT / "runs" / "learning"))
    p.add_argument("--results", default=str(HERE / "learning_results.json"),
                   help="every measured (row, seed); rows run in separate invocations add up")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite learning.md and the plot from learning_results.json")
    args = p.parse_args(argv)
    rows = [x for r in args.rows.split(",") if r for x in GROUPS.get(r, [r])]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"learning_table: unknown rows {unknown}; known: {', '.join(ROWS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Committed with learning.md: rows run in separate invocations, or in another session, add
    # up; a (row, seed) measured again replaces the old one.
    results_file = Path(args.results)
    results: list[dict] = json.loads(results_file.read_text()) if results_file.exists() else []
    if args.render_only:
        results.sort(key=_order)
        plot(results, out / "learning.png")
        write_markdown(results, out / "learning.md", out / "learning.png")
        return 0
    for row in rows:
        for seed in (int(s) for s in args.seeds.split(",")):
            print(f"[learning] {row} seed {seed} ...", flush=True)
            try:
                res = run_row(row, seed, Path(args.data), Path(args.runs))
            except RuntimeError as e:
                res = {"row": row, "recipe": ROWS[row][0], "seed": seed,
                       "error": str(e).splitlines()[0][:120]}
                print(e, file=sys.stderr)
            results = [r for r in results if (r["row"], r["seed"]) != (row, seed)] + [res]
            results.sort(key=_order)
            print(f"[learning] {json.dumps({k: v for k, v in res.items() if k != 'curve'})}",
                  flush=True)
            results_file.write_text(json.dumps(results, indent=1))
            png = out / "learning.png"
            plot(results, png)
            write_markdown(results, out / "learning.md", png)
    mine = [r for r in results if r["row"] in rows]
    return 0 if all("error" not in r and verdict(r) for r in mine) else 1


if __name__ == "__main__":
    sys.exit(main())
