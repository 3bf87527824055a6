"""`mmrl bench --which async`: the quickstart (recipes/quickstart.yaml) run whole twice in one
process, synchronous (rollout.max_staleness=0) then asynchronous (=1), each as a user runs it
(SFT warm-up, evaluations, RL). What is compared:

- RL steps/s: logged RL steps over the wall time between the first and the last logged step
  (metrics.jsonl's `time`; the first step, which waits for the first batch either way, is the
  start line), so evaluation before and after RL is not counted;
- the learning: accuracy before / after RL, shuffled images and chance, against the learning
  table's bar (gain >= 0.15; shuffled within 0.05 of chance or no better than before RL;
  docs/learning.md).

Both runs use the torch threads the process has (k = 1 splits them between the sampler and the
trainer). The machine's load at start and end is reported: the ratio is what to read.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
QUICK = ("train.steps=6", "sft.steps=4", "sft.eval_every=2", "log.rollouts_every=0")


def meets_bar(summary: dict) -> bool:
    """docs/learning.md's bar on an accuracy metric."""
    before, after = summary.get("accuracy_before_rl"), summary.get("accuracy_after_rl")
    shuffled, chance = summary.get("accuracy_shuffled_images"), summary.get("chance")
    if None in (before, after, shuffled, chance):
        return False
    return after - before >= 0.15 and (abs(shuffled - chance) <= 0.05 or shuffled <= before)


def _rl_rate(run_dir: Path) -> tuple[float, int, float]:
    """(RL steps/s between the first and last logged step, steps, their wall seconds)."""
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "time" in r]
    first, last = rows[0], rows[-1]
    wall = last["time"] - first["time"]
    steps = last["step"] - first["step"]
    return (steps / wall if wall > 0 else float("nan")), steps, wall


def bench_async(out_dir: str | Path, *, quick: bool = False, seed: int = 0, log=print) -> dict:
    from mmrl import config
    from mmrl.train.run import train

    if not RECIPE.is_file():
        raise FileNotFoundError(f"{RECIPE}: the async benchmark runs the repository's quickstart "
                                f"recipe; run it from a source checkout")
    out = Path(out_dir)
    data = out / "data" / "counting"
    results: dict = {"recipe": str(RECIPE.name), "seed": seed, "quick": quick, "runs": {}}
    for k in (0, 1):
        run_dir = out / f"quickstart_k{k}"
        overrides = [f"log.run_dir={run_dir}", "train.overwrite=true", f"train.seed={seed}",
                     f"rollout.max_staleness={k}", "log.progress=off", "log.tensorboard=false",
                     f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}",
                     *(QUICK if quick else ())]
        log(f"[bench] async: quickstart with rollout.max_staleness={k} (load "
            f"{os.getloadavg()[0]:.1f})")
        started = time.time()
        summary = train(config.load(RECIPE, overrides))
        rate, steps, wall = _rl_rate(run_dir)
        results["runs"][f"k{k}"] = {
            "max_staleness": k, "rl_steps_per_s": rate, "rl_steps_timed": steps,
            "rl_wall_s": wall, "run_wall_s": time.time() - started,
            "load_average_end": list(os.getloadavg()),
            **{key: summary.get(key) for key in ("accuracy_before_rl", "accuracy_after_rl",
                                                 "accuracy_shuffled_images", "chance")},
            "meets_bar": meets_bar(summary)}
        log(f"[bench] async k={k}: {rate:.2f} RL steps/s, accuracy "
            f"{summary.get('accuracy_before_rl')} -> {summary.get('accuracy_after_rl')}")
    runs = results["runs"]
    results["speedup"] = runs["k1"]["rl_steps_per_s"] / runs["k0"]["rl_steps_per_s"]
    return results


def async_table(r: dict) -> list[str]:
    quick = " (quick: not numbers to report)" if r["quick"] else ""
    lines = ["### Asynchronous rollouts: quickstart, rollout.max_staleness 0 vs 1", "",
             f"recipes/{r['recipe']}, seed {r['seed']}{quick}; RL steps/s between the first and "
             f"last logged step; bar: docs/learning.md.", "",
             "| max_staleness | RL steps/s | RL wall (s) | before RL | after RL | shuffled | "
             "chance | meets the bar |", "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for run in r["runs"].values():
        lines.append(f"| {run['max_staleness']} | {run['rl_steps_per_s']:.2f} | "
                     f"{run['rl_wall_s']:.0f} | {fmt(run['accuracy_before_rl'])} | "
                     f"{fmt(run['accuracy_after_rl'])} | {fmt(run['accuracy_shuffled_images'])} | "
                     f"{fmt(run['chance'])} | {'yes' if run['meets_bar'] else 'no'} |")
    lines += ["", f"k = 1 over k = 0: **x{r['speedup']:.2f}** RL steps/s."]
    return lines
