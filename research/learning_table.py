"""The learning table (docs/learning.md): every recipe learns a tiny offline task from its media.

For each row: write the task in the recipe's anchor format (mmrl.data.anchor_tasks), convert it
with `mmrl data convert --from FORMAT` (a subprocess, as a user runs it), train with
`mmrl train recipes/R/config.yaml research/layers/R.yaml` (SFT warm-up, then GRPO) and read
summary.json: the held-out metric before RL, after RL, and after RL with the media shuffled
across samples; and rollouts.jsonl: the share of the last logged step's completions cut after a
whole answer. Rows run one after another (the machine is small and shared).

    bash research/learning_table.sh [--rows counting,detection] [--seeds 0,1,2] [--eval-seed N]
                                    [--set KEY=VALUE ...] [--render-only]

The rows are in learning_rows.py, the rendering in learning_render.py. Research, not product:
nothing under mmrl/ or rewards/ imports this folder (research/README.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "research"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from learning_render import (BAR_CHANCE, BAR_GAIN, FINDINGS, methods_table, plot,  # noqa: E402,F401
                             read_findings, verdict, write_markdown)
from learning_rows import (GENERATED, GROUPS, METHODS, PRETEXT, PROCESSES, RATES, ROWS,  # noqa: E402,F401
                           STARTS_FROM, WARMUP)
from rewards.looked_at import holds  # noqa: E402

# Every completion of a logged step goes to rollouts.jsonl: the cut+text share is over all of them.
ALL_ROLLOUTS = "log.rollouts_per_step=100000"
# Every row's processed prompts (and warm-up demonstrations) stay in memory: the SFT warm-up
# draws with replacement, so on the anchor rows' 1000 training records the default LRU of 512
# missed about half its draws, each a decode and a processor call (a one-off cProfile: 37% of a
# video_qa warm-up step while the cache filled). The features are the same; only time changes.
ALL_CACHED = "data.feature_cache=4096"
# A row measures its own held-out draw; the field benchmarks a recipe names (eval.benchmarks,
# docs/benchmarks-eval.md) need their downloaded copies and would only add time here.
NO_BENCHMARKS = "eval.benchmarks=[]"


def _mmrl(args: list[str], log: Path, processes: int = 1) -> None:
    """`mmrl ARGS` into `log`; with `processes` > 1 through torchrun, data-parallel, one thread
    each (as scripts/train.sh launches it)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    cli = ["-c", "import sys; from mmrl.cli import main; sys.exit(main(sys.argv[1:]))"]
    if processes > 1:
        env["OMP_NUM_THREADS"] = "1"
        cli = ["-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
               "-m", "mmrl.cli"]
    with log.open("a") as f:
        proc = subprocess.run([sys.executable, *cli, *args], cwd=ROOT, env=env,
                              stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = "".join(log.read_text().splitlines(True)[-15:])
        raise RuntimeError(f"mmrl {' '.join(args[:2])} failed (rc {proc.returncode}); {log}:\n{tail}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_seed(eval_seed: int | None) -> None:
    if eval_seed == 0:  # the generators' default: the training records come from seed 0
        raise SystemExit("learning_table: --eval-seed 0 is the training data's seed, so its "
                         "records are training records; pick another")


def prepare_pretext(task: str, data_root: Path, log: Path,
                    eval_seed: int | None = None) -> tuple[Path, Path]:
    """A pretext task from a folder of unlabelled photo-like scenes (synthetic.paint_scenes) or
    clips of a falling ball (synthetic_av.paint_falling), written by `mmrl data generate TASK OUT
    source=FOLDER`. With `eval_seed`, the held-out records come from a folder painted with that
    seed and are generated with it. Deterministic, cached."""
    from mmrl.data.synthetic import paint_scenes
    from mmrl.data.synthetic_av import paint_falling

    _fresh_seed(eval_seed)
    kind, args = PRETEXT[task]
    paint = {"photos": paint_scenes, "videos": paint_falling}[kind]
    out = data_root / task
    if not (out / "eval.jsonl").exists():
        # As many as records: rotation and temporal_jigsaw take one each, so the held-out ones
        # are unseen (clip_counting joins clips of any).
        paint(data_root / kind, n=args["n_train"] + args["n_eval"])
        _mmrl(["data", "generate", task, str(out), f"source={data_root / kind}",
               *(f"{k}={v}" for k, v in args.items())], log)
    if eval_seed is None:
        return out / "train.jsonl", out / "eval.jsonl"
    fresh = data_root / f"{task}_eval{eval_seed}"
    if not (fresh / "eval.jsonl").exists():
        folder = data_root / f"{kind}_seed{eval_seed}"
        paint(folder, n=args["n_eval"], seed=eval_seed)
        _mmrl(["data", "generate", task, str(fresh), f"source={folder}",
               *(f"{k}={v}" for k, v in {**args, "n_train": 0, "seed": eval_seed}.items())], log)
    return out / "train.jsonl", fresh / "eval.jsonl"


def prepare_generated(row: str, data_root: Path, log: Path,
                      eval_seed: int | None = None) -> tuple[Path, Path]:
    """Records a generator writes as mmrl JSONL (`mmrl data generate TASK OUT k=v ...`); with
    `eval_seed`, the held-out ones are drawn again from that seed. Deterministic, cached by the
    generator's arguments."""
    _fresh_seed(eval_seed)
    task, args = GENERATED[row]
    args = {k: json.dumps(v) if isinstance(v, (bool, list, dict)) else v for k, v in args.items()}
    out = data_root / row
    made_by = json.dumps({"generator": task, **args}, sort_keys=True)  # a changed row regenerates
    if not _cached(out, made_by):
        # Written whole into a scratch folder, then renamed: a run killed halfway leaves no
        # cache that looks complete (records without their warm-up field, say).
        part = data_root / f"{row}.partial"
        if part.exists():
            shutil.rmtree(part)
        _mmrl(["data", "generate", task, str(part), *(f"{k}={v}" for k, v in args.items())], log)
        (part / "generated_by.json").write_text(made_by)
        if row in WARMUP:  # each training record's warm-up target, as a field sft.target names
            records = [json.loads(x) for x in (part / "train.jsonl").read_text().splitlines()]
            (part / "train.jsonl").write_text("".join(
                json.dumps({**r, **WARMUP[row](r)}) + "\n" for r in records))
        if out.exists():  # made with other arguments, or an older harness's half-written folder
            shutil.rmtree(out)
        part.rename(out)
    if eval_seed is None:
        return out / "train.jsonl", out / "eval.jsonl"
    fresh = data_root / f"{row}_eval{eval_seed}"
    if not _cached(fresh, made_by):
        if fresh.exists():
            shutil.rmtree(fresh)
        _mmrl(["data", "generate", task, str(fresh),
               *(f"{k}={v}" for k, v in {**args, "n_train": 0, "seed": eval_seed}.items())], log)
        (fresh / "generated_by.json").write_text(made_by)
    return out / "train.jsonl", fresh / "eval.jsonl"


def _cached(folder: Path, made_by: str) -> bool:
    """Whether `folder` holds a whole generated split made with these generator arguments (a
    cache from before a row's arguments changed is regenerated, never silently reused)."""
    stamp = folder / "generated_by.json"
    return (folder / "eval.jsonl").exists() and stamp.exists() and stamp.read_text() == made_by


def prepare(recipe: str, data_root: Path, log: Path,
            eval_seed: int | None = None) -> tuple[Path, Path]:
    """Anchor-format task files, converted to native JSONL by the CLI. With `eval_seed`, the
    held-out records are the recipe's task drawn again from that seed (no training records), so
    the table can be checked on records no one tuned on. Deterministic, cached."""
    from mmrl.data import anchor_tasks
    from mmrl.data.synthetic import GENERATORS

    _fresh_seed(eval_seed)
    generate = GENERATORS.get(f"anchor_{recipe}")
    out = data_root / recipe
    conv = {s: out / "converted" / f"{s}.jsonl" for s in ("train", "eval")}
    if not all(p.exists() for p in conv.values()):
        made = generate(out)
        assert made["format"] == anchor_tasks.ANCHORS[recipe][2]
        for split, path in conv.items():
            _mmrl(["data", "convert", "--from", made["format"], made[split], str(path)], log)
    if eval_seed is None:
        return conv["train"], conv["eval"]
    fresh = out / f"eval_seed{eval_seed}"
    converted = fresh / "converted" / "eval.jsonl"
    if not converted.exists():
        made = generate(fresh, seed=eval_seed, n_train=0)
        _mmrl(["data", "convert", "--from", made["format"], made["eval"], str(converted)], log)
    return conv["train"], converted


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


def _cut_text(run_dir: Path) -> float | None:
    """The share of the last logged step's completions in rollouts.jsonl cut at the token limit
    after a whole answer (mmrl's own `completion/cut_after_answer_frac` rule)."""
    from mmrl.train.rollout_utils import cut_after_answer_frac

    path = run_dir / "rollouts.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    if not rows:
        return None
    last = [r for r in rows if r["step"] == max(r["step"] for r in rows)]
    return cut_after_answer_frac([r["completion"] for r in last], [r["truncated"] for r in last])


def tool_use(run_dir: Path, name: str) -> dict | None:
    """Tool use on the held-out records of evaluation `name` (eval/NAME.jsonl, first draws): the
    share of trajectories that called a tool, and the share whose crops (what the tool read, in
    original pixels) held the record's whole `mark_box` (what must be read), or whose `frames`
    spans held the record's `flash_span` -- within the run's looked_at `max_ratio` of the
    target's size where it sets one (a look at the whole image holds the mark, unreadably).
    None for runs without tools."""
    path = run_dir / "eval" / f"{name}.jsonl"
    rows = [r for r in map(json.loads, path.read_text().splitlines())
            if r["draw"] == 0] if path.exists() else []
    if not rows or "seen" not in rows[0]:
        return None
    ratio = _looked_at_ratio(run_dir)
    found = [any(holds(s[key], r["fields"][target], ratio) for looks in r["seen"] for s in looks
                 if key in s) for key, target in (("box", "mark_box"), ("span", "flash_span"))
             for r in rows if target in r["fields"]]  # video_search: the span held the flash
    return {"called": sum(any(c["name"] for c in r["calls"]) for r in rows) / len(rows),
            "found": sum(found) / len(found) if found else None}


def _looked_at_ratio(run_dir: Path) -> float | None:
    """The run's looked_at reward's max_ratio (config.yaml), None without one."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (
        run_dir / "config.yaml").exists() else {}
    return next(((r.get("params") or {}).get("max_ratio") for r in cfg.get("rewards") or []
                 if r.get("name") == "looked_at"), None)


class LoadMeter:
    """The mean 1-minute load average while a run lasts, read every `every` seconds: the machine
    is shared, and wall time grows with what else runs on it."""

    def __init__(self, every: float = 15.0):
        self.samples, self.every, self.done = [os.getloadavg()[0]], every, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.done.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadMeter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.samples.append(os.getloadavg()[0])

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)


def _run_dir(row: str, seed: int, runs_root: Path) -> Path:
    return runs_root / f"{row.replace('+', '_')}_s{seed}"


def _final_checkpoint(row: str, seed: int, data_root: Path, runs_root: Path,
                      eval_seed: int | None = None) -> Path:
    """The last complete checkpoint of `row` at `seed`, running the row first when it has none."""
    from mmrl.train import checkpoint

    run_dir = _run_dir(row, seed, runs_root)
    if checkpoint.latest(run_dir) is None:
        run_row(row, seed, data_root, runs_root, eval_seed=eval_seed)
    found = checkpoint.latest(run_dir)
    if found is None:
        raise RuntimeError(f"{row} seed {seed} saved no checkpoint under {run_dir}")
    return found


def run_row(row: str, seed: int, data_root: Path, runs_root: Path, *,
            eval_seed: int | None = None, overrides: list[str] = ()) -> dict:
    recipe, extra = ROWS[row]
    extra = extra + list(overrides)
    if row in STARTS_FROM:
        start = _final_checkpoint(STARTS_FROM[row], seed, data_root, runs_root, eval_seed)
        extra = extra + [f"model.path={start}"]
    run_dir = _run_dir(row, seed, runs_root)
    shutil.rmtree(run_dir, ignore_errors=True)  # measured again: the new run replaces the old
    run_dir.mkdir(parents=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    log.write_text("")
    train, evalf = (prepare_pretext(row, data_root, log, eval_seed) if row in PRETEXT
                    else prepare_generated(row, data_root, log, eval_seed) if row in GENERATED
                    else prepare(recipe, data_root, log, eval_seed))
    cfg = [f"recipes/{recipe}/config.yaml", f"research/layers/{recipe}.yaml"]
    started = time.perf_counter()
    with LoadMeter() as load:
        _mmrl(["train", *cfg, f"data.train={train}", f"data.eval={evalf}", f"train.seed={seed}",
               f"log.run_dir={run_dir}", f"name=learn_{run_dir.name[:-len(f'_s{seed}')]}",
               ALL_ROLLOUTS, ALL_CACHED, NO_BENCHMARKS, *extra], log, PROCESSES.get(row, 1))
    wall = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    from mmrl import config
    metric = config.load(str(ROOT / cfg[0]), [str(ROOT / cfg[1]), *extra]).eval.metric_reward
    return {"row": row, "recipe": recipe, "seed": seed, "eval_seed": eval_seed,
            "overrides": list(overrides), "metric": metric, "wall_s": wall, "load": load.mean,
            "processes": PROCESSES.get(row, 1),
            "measured": time.time(), "commit": _commit(), "text_after_scored": True,
            "before": summary.get("accuracy_before_rl"), "after": summary.get("accuracy_after_rl"),
            "shuffled": summary.get("accuracy_shuffled_images"), "chance": summary.get("chance"),
            "sft_steps": (summary.get("sft") or {}).get("steps"), "rl_steps": summary.get("steps"),
            "rate": _rate(run_dir, RATES.get(row)), "cut_text": _cut_text(run_dir),
            "zero_std_late": _late_mean(run_dir, "groups/zero_std_frac"),
            "tool_use": {"before": tool_use(run_dir, "before_rl"),
                         "after": tool_use(run_dir, "after_rl")},
            "curve": [(0, summary.get("accuracy_before_rl"))] + _curve(run_dir)}


def _late_mean(run_dir: Path, key: str, share: float = 0.2) -> float | None:
    """The metric's mean over the last `share` of the RL steps."""
    rows = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    late = rows[int(len(rows) * (1 - share)):]
    return sum(m[key] for m in late) / len(late) if late else None


def _commit() -> str | None:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True)
    return proc.stdout.strip() or None


def _order(r: dict) -> tuple[int, int]:
    return (list(ROWS).index(r["row"]) if r["row"] in ROWS else len(ROWS), r["seed"])


def _same(a: dict, b: dict) -> bool:
    return (a["row"], a["seed"], a.get("eval_seed")) == (b["row"], b["seed"], b.get("eval_seed"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS),
                   help="rows or groups (recipes, methods), comma-separated; default all")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--eval-seed", type=int, default=None,
                   help="draw each row's held-out records from this seed (not 0, the training "
                        "data's); default: the records generated after the training ones")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every row run (tuning; recorded with each result)")
    p.add_argument("--out", default=str(ROOT / "docs"), help="folder for learning.md and .png")
    p.add_argument("--data", default=str(ROOT / "data" / "learning"))
    p.add_argument("--runs", default=str(ROOT / "runs" / "learning"))
    p.add_argument("--results", default=str(HERE / "learning_results.json"),
                   help="every measured (row, seed, eval seed); separate invocations add up")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite learning.md and the plot from learning_results.json")
    args = p.parse_args(argv)
    rows = [x for r in args.rows.split(",") if r for x in GROUPS.get(r, [r])]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"learning_table: unknown rows {unknown}; known: {', '.join(ROWS)}")
    _fresh_seed(args.eval_seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Committed with learning.md: rows run in separate invocations, or in another session, add
    # up; a (row, seed, eval seed) measured again replaces the old one.
    results_file = Path(args.results)
    results: list[dict] = json.loads(results_file.read_text()) if results_file.exists() else []
    mine = []
    for row in rows if not args.render_only else []:
        for seed in (int(s) for s in args.seeds.split(",")):
            print(f"[learning] {row} seed {seed} ...", flush=True)
            try:
                res = run_row(row, seed, Path(args.data), Path(args.runs),
                              eval_seed=args.eval_seed, overrides=args.overrides)
            except RuntimeError as e:
                res = {"row": row, "recipe": ROWS[row][0], "seed": seed,
                       "eval_seed": args.eval_seed, "measured": time.time(),
                       "error": str(e).splitlines()[0][:120]}
                print(e, file=sys.stderr)
            results = [r for r in results if not _same(r, res)] + [res]
            mine.append(res)
            print(f"[learning] {json.dumps({k: v for k, v in res.items() if k != 'curve'})}",
                  flush=True)
            results_file.write_text(json.dumps(sorted(results, key=_order), indent=1))
    results.sort(key=_order)
    plot(results, out / "learning.png")
    write_markdown(results, out / "learning.md", out / "learning.png")
    return 0 if all("error" not in r and verdict(r) for r in mine) else 1


if __name__ == "__main__":
    sys.exit(main())
