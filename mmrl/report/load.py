"""Reading a run dir: metrics.jsonl, rollouts.jsonl, summary.json, config.yaml.

A report is most wanted when a run went wrong, so reading is forgiving: a truncated last line
(the trainer was killed mid-write), a missing file or a malformed row is skipped and counted in
`Run.problems`, which the page shows, instead of aborting the report.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    path: Path
    name: str
    metrics: list[dict] = field(default_factory=list)
    rollouts: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    config_text: str = ""
    config: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # The field benchmarks before and after RL (eval/benchmarks/NAME.json), as metric rows
    # {"step", "bench/NAME"}; their periodic values are in metrics.jsonl already.
    benchmarks: list[dict] = field(default_factory=list)
    benchmark_metrics: dict[str, str] = field(default_factory=dict)  # name -> headline metric

    @property
    def metric_keys(self) -> set[str]:
        """Keys with at least one finite number (step and wall-clock time excluded)."""
        keys = set()
        for row in self.metrics + self.benchmarks:
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) \
                        and not isinstance(v, bool) and math.isfinite(v):
                    keys.add(k)
        return keys

    @property
    def rollout_steps(self) -> list[int]:
        return sorted({r["step"] for r in self.rollouts if isinstance(r.get("step"), int)})


def _read_jsonl(path: Path, problems: list[str]) -> list[dict]:
    if not path.is_file():
        problems.append(f"{path.name} not found")
        return []
    rows, bad = [], 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    if bad:
        problems.append(f"{path.name}: skipped {bad} unreadable line(s)")
    return rows


def _read_config(path: Path, problems: list[str]) -> tuple[str, dict]:
    if not path.is_file():
        return "", {}
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        import yaml  # PyYAML ships with omegaconf, a core dependency

        data = yaml.safe_load(text)
        return text, data if isinstance(data, dict) else {}
    except Exception as e:  # unparsable YAML still shows as text
        problems.append(f"config.yaml: {e}")
        return text, {}


def load_run(path: str | Path, name: str | None = None) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"run dir not found: {path}")
    run = Run(path=path, name=name or path.name)
    run.metrics = _read_jsonl(path / "metrics.jsonl", run.problems)
    run.rollouts = _read_jsonl(path / "rollouts.jsonl", run.problems)
    summary_path = path / "summary.json"
    if summary_path.is_file():
        try:
            data = json.loads(summary_path.read_text(encoding="utf-8"))
            run.summary = data if isinstance(data, dict) else {"summary": data}
        except json.JSONDecodeError as e:
            run.problems.append(f"summary.json: {e}")
    run.config_text, run.config = _read_config(path / "config.yaml", run.problems)
    _read_benchmarks(run)
    return run


def _read_benchmarks(run: Run) -> None:
    for f in sorted((run.path / "eval" / "benchmarks").glob("*.json")):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            run.problems.append(f"{f.name}: {e}")
            continue
        name = doc.get("benchmark", f.stem)
        run.benchmark_metrics[name] = str(doc.get("metric", "score"))
        run.benchmarks += [{"step": h.get("step") or 0, f"bench/{name}": h.get("score")}
                           for h in doc.get("history", [])
                           if h.get("stage") in ("before_rl", "after_rl")]


def run_names(paths: list[Path]) -> list[str]:
    """Directory names, lengthened with parents until they differ (runs/a/seed0 vs runs/b/seed0),
    because the names are what tells the runs apart in every legend."""
    resolved = [p.resolve() for p in paths]
    depth = 1
    while True:
        names = ["/".join(p.parts[-depth:]) for p in resolved]
        if len(set(names)) == len(names) or depth >= max(len(p.parts) for p in resolved):
            return names
        depth += 1


def choose_steps(logged: list[int], wanted: list[int] | None) -> tuple[list[int], list[str]]:
    """Steps to browse and notes for the page. Default: first, middle and last logged steps.
    A requested step that was not logged maps to the nearest logged one, with a note.

    >>> choose_steps([10, 20, 30, 40, 50], None)
    ([10, 30, 50], [])
    >>> choose_steps([10, 20, 30], [19, 30])
    ([20, 30], ['step 19 has no logged rollouts: showing step 20'])
    """
    if not logged:
        return [], []
    if not wanted:
        picks = [logged[0], logged[len(logged) // 2], logged[-1]]
        return sorted(set(picks)), []
    chosen, notes = [], []
    for s in wanted:
        nearest = min(logged, key=lambda x: (abs(x - s), x))
        if nearest != s:
            notes.append(f"step {s} has no logged rollouts: showing step {nearest}")
        if nearest not in chosen:
            chosen.append(nearest)
    return sorted(chosen), notes


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys: summary.json and config.yaml become two-column tables.

    >>> flatten({"a": 1, "b": {"c": 2}})
    {'a': 1, 'b.c': 2}
    """
    if not isinstance(d, dict):
        return {prefix or "value": d}
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
