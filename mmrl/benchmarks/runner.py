"""One benchmark on one model: read the local copy, render lmms-eval's prompts, draw greedy
completions on the held-out evaluation's path (train/evaluate.py `draw_texts`), score as the
task scores, write RUN/eval/benchmarks/NAME.json (settings, metrics, history, per-sample rows)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mmrl.benchmarks import get
from mmrl.benchmarks.base import Context
from mmrl.train import dist
from mmrl.train.evaluate import draw_texts
from mmrl.train.logging import json_safe

if TYPE_CHECKING:
    from mmrl.config import BenchmarkSpec, RunConfig
    from mmrl.models.codec import Codec

FIXTURE = "fixture"  # path: a small copy in the benchmark's layout, written by its fixture writer
FIXTURE_ROWS = 8


def parse_arg(text: str, limit: int | None = None, max_new_tokens: int | None = None):
    """`--benchmark NAME[=PATH]` (with `--limit`, `--max-new-tokens`) -> BenchmarkSpec."""
    from mmrl.config import BenchmarkSpec

    name, _, path = text.partition("=")
    get(name)  # an unknown name fails here, before any model loads
    return BenchmarkSpec(name=name, path=path or None, limit=limit,
                         max_new_tokens=max_new_tokens)


def default_root(name: str) -> Path:
    """Where a copy is looked for without a path: $MMRL_BENCHMARKS_DIR/NAME, else
    data/benchmarks/NAME."""
    return Path(os.environ.get("MMRL_BENCHMARKS_DIR") or "data/benchmarks") / name


def root_of(spec: BenchmarkSpec, out_dir: Path) -> Path:
    bench = get(spec.name)
    if spec.path == FIXTURE:
        root = out_dir / "eval" / "benchmarks" / "fixtures" / spec.name
        if not root.is_dir():  # written aside, then renamed: ranks may race to write it
            tmp = root.with_name(f"{spec.name}.{os.getpid()}.tmp")
            bench.write_fixture(tmp, spec.limit or FIXTURE_ROWS, 0)
            try:
                os.replace(tmp, root)
            except OSError:  # another rank's copy landed first: same content, keep it
                shutil.rmtree(tmp)
        return root
    return Path(spec.path) if spec.path else default_root(spec.name)


def budget(cfg: RunConfig) -> dict:
    """The media budget the prompts were given, stated with every result."""
    d = cfg.data
    return {"image_min_pixels": d.image_min_pixels, "image_max_pixels": d.image_max_pixels,
            "video_nframes": d.video_nframes, "video_fps": d.video_fps,
            "video_max_frames": d.video_max_frames, "video_max_pixels": d.video_max_pixels,
            "audio_max_seconds": d.audio_max_seconds}


def run_benchmark(model, codec: Codec, cfg: RunConfig, spec: BenchmarkSpec, out_dir: Path,
                  stage: str = "eval", step: int | None = None,
                  info: dist.DistInfo | None = None, envs=None) -> dict:
    """Run one benchmark; every rank calls it with `info`, each drawing its share. -> metrics
    (`score`: the headline metric, `n`, `failed`, `seconds`, the task's metrics). `envs`: the
    run's environment kind (its tools, built once per run), used by a benchmark with tools."""
    started, info = time.perf_counter(), info or dist.DistInfo()
    bench, root = get(spec.name), root_of(spec, out_dir)
    if not spec.tools:  # the tool-less setting of a run with tools (V*: both are reported)
        cfg = dataclasses.replace(cfg, tools=dataclasses.replace(cfg.tools, use=[]))
        envs = None  # single_turn, built by draw_texts
    rows = bench.rows(root)
    rows = rows[:spec.limit] if spec.limit else rows
    ctx = Context(box_coords=codec.box_coords if spec.family_coords else "norm1",
                  min_pixels=cfg.data.image_min_pixels, max_pixels=cfg.data.image_max_pixels,
                  rng=random.Random(cfg.train.seed))
    samples = [_sample(bench, row, root, i, ctx) for i, row in enumerate(rows)]
    n = len(samples)
    mine = samples[n * info.rank // info.world:n * (info.rank + 1) // info.world]
    max_new = spec.max_new_tokens or bench.max_new_tokens
    texts = draw_texts(model, codec, mine, cfg, max_new, envs)
    if info.enabled:
        texts = [t for part in dist.all_gather_object(texts, info) for t in part]
    # Scored in row order on every rank: lmms-eval's random fallback draws from one stream.
    results = [bench.score(row, t, ctx) if t is not None else None for row, t in zip(rows, texts)]
    scored = [r for r in results if r is not None]
    metrics = bench.aggregate(scored)
    out = {"score": metrics[bench.metric], **metrics, "n": len(scored), "failed": n - len(scored),
           "seconds": time.perf_counter() - started}
    if info.main:
        out_file = out_dir / "eval" / "benchmarks" / f"{spec.key}.json"
        per_sample = [dict(id=s.id, prompt=_text(s), completion=t, result=r)
                      for s, t, r in zip(samples, texts, results)]
        _write(out_file, bench, spec, root, cfg, out, max_new, stage, step, per_sample)
    return out


def _sample(bench, row: dict, root: Path, i: int, ctx: Context):
    """A row as a Sample; a row outside the benchmark's Hub schema is one line naming it."""
    try:
        return bench.to_sample(row, root, f"{bench.name}:{i}", ctx)
    except (KeyError, TypeError, ValueError, SyntaxError) as e:
        raise SystemExit(f"benchmark {bench.name!r}: row {i} of {root / bench.files} is not in "
                         f"{bench.hub}'s layout ({type(e).__name__}: {e}); columns: "
                         f"{', '.join(sorted(row))}") from e


def _text(sample) -> str:
    """The prompt as the model saw it, media marked where they sit (MMMU interleaves them)."""
    return "\n".join(c["text"] if c["type"] == "text" else f"<{c['type']}>"
                     for c in sample.messages[-1]["content"])


def _write(path: Path, bench, spec, root: Path, cfg: RunConfig, out: dict, max_new: int,
           stage: str, step: int | None, rows: list[dict]) -> None:
    """NAME.json: this stage's settings, metrics and rows; `history` keeps every stage's
    metrics of the run (before RL, the periodic steps, after RL)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    history = [h for h in old.get("history", []) if h.get("stage") != stage]
    history.append({"stage": stage, "step": step, **out})
    doc = {"benchmark": spec.key, "title": bench.title, "lmms_eval_task": bench.lmms_task,
           "source": str(root), "limit": spec.limit, "stage": stage, "step": step,
           "metric": bench.metric, "metrics": out, "judge_metrics": bench.judge or "none",
           "notes": bench.notes, "coords": "family" if spec.family_coords else "task",
           "generation": {"greedy": True, "max_new_tokens": max_new,
                          "task_max_new_tokens": bench.max_new_tokens},
           "tools": [t.name for t in cfg.tools.use], "budget": budget(cfg),
           "history": history, "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(doc), indent=1, default=str))


def evaluate_checkpoint(cfg: RunConfig, checkpoint: str, specs: list,
                        out_dir: str | None = None) -> dict:
    """`mmrl eval --benchmark`: each benchmark on a saved model (a run dir: its latest
    checkpoint, results in RUN/eval/benchmarks; else CHECKPOINT/eval/benchmarks)."""
    from mmrl.train.evaluate import load_checkpoint

    check_copies_of(specs)  # a missing copy fails before the model loads
    base = Path(out_dir) if out_dir else Path(checkpoint)
    model, codec, _ = load_checkpoint(cfg, checkpoint)
    return {spec.key: run_benchmark(model, codec, cfg, spec, base)
            for spec in specs}


def check_copies(cfg: RunConfig) -> None:
    """At a run's start: every configured benchmark's copy is there (MissingCopy otherwise), so
    a missing download fails before the warm-up and the first evaluation, not after them."""
    check_copies_of(cfg.eval.benchmarks)


def check_copies_of(specs: list) -> None:
    for spec in specs:
        if spec.path != FIXTURE:
            get(spec.name).rows(root_of(spec, Path(".")))


def run_due(policy, cfg: RunConfig, run_dir: Path, stage: str, step: int, envs=None) -> dict:
    """In training: the configured benchmarks due at `stage` (before_rl and after_rl: all;
    a step: those whose `every` divides it) on the Policy's model -> {"bench/NAME": headline,
    "time/benchmarks": seconds}, empty when none is due. Every rank calls it. `envs`: the
    trainer's environment kind (Trainer.envs), so a benchmark builds no Toolbox of its own."""
    due = [s for s in cfg.eval.benchmarks
           if not stage.startswith("step_") or (s.every and step % s.every == 0)]
    if not due:
        return {}
    started, out = time.perf_counter(), {}
    with policy.full_params():  # sharded weights: gathered on every rank
        for spec in due:
            res = run_benchmark(policy.model, policy.codec, cfg, spec,
                                run_dir, stage=stage, step=step, info=policy.info, envs=envs)
            out[f"bench/{spec.key}"] = res["score"]
    out["time/benchmarks"] = time.perf_counter() - started
    return out


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """The run summary's before -> after lines, one per benchmark."""
    before = summary.get("benchmarks_before_rl") or {}
    after = summary.get("benchmarks_after_rl") or {}

    def fmt(v) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"
    rows = []
    for key in sorted(k for k in set(before) | set(after) if k.startswith("bench/")):
        name = key[len("bench/"):]
        metric = get(name.removesuffix("_no_tools")).metric
        rows.append((f"{name} ({metric})", f"{fmt(before.get(key))} -> {fmt(after.get(key))}"))
    return rows
