"""Page sections (#summary, #curves, #rollouts) and the HTML shell around them.

The page is one file with inline CSS: the step browser is plain <details>/<summary>, so the
report opens offline, in any browser, from an e-mail attachment. The only script (3 lines, inline)
opens a closed step when a "step N" link targets it; without it the page still works.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from mmrl.report import curves, parse
from mmrl.report.load import Run, choose_steps, flatten
from mmrl.report.markup import esc, fmt
from mmrl.report.rollouts import step_html

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;
background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:14px 24px;position:sticky;top:0;z-index:2}
header h1{font-size:18px;margin:0 0 4px}header a{color:#9cc3ff;margin-right:14px}
main{padding:8px 24px 40px;max-width:1500px}
section,details.step{scroll-margin-top:90px}
section{background:#fff;border-radius:8px;padding:12px 18px;margin:16px 0;
box-shadow:0 1px 3px rgba(0,0,0,.08)}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #dde1e7;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:10px}
.grid figure{margin:0;border:1px solid #e4e7ec;border-radius:6px;padding:4px;background:#fff}
.grid img{width:100%;height:auto}
details.step{border:1px solid #d5dae1;border-radius:6px;margin:8px 0;background:#fbfcfd}
details.step>summary{cursor:pointer;padding:8px 12px;font-weight:600;background:#eef1f5}
.group{margin:10px 12px;border-left:3px solid #8aa4c8;padding-left:10px}
.ghead{font-weight:600;color:#41526b}.prompt{white-space:pre-wrap;color:#4a5568;margin:4px 0 8px;
font-size:13px;max-height:8em;overflow:auto}
.rollout{border:1px solid #e1e5ea;border-radius:6px;margin:8px 0;background:#fff}
.rhead{padding:5px 10px;background:#f6f7f9;border-bottom:1px solid #e1e5ea;font-size:13px}
.rollout>.text{padding:8px 10px}
.media{flex:0 1 auto;max-width:660px}.media figure{margin:0 0 6px}
.media figcaption{font-size:12px;color:#555}
.text{flex:1 1 360px;min-width:300px}
pre.completion{white-space:pre-wrap;word-break:break-word;background:#f7f7f9;border:1px solid #e6e6ea;
padding:6px 8px;margin:0 0 6px;max-height:16em;overflow:auto;font-size:12.5px}
table.kv,table.rewards{margin:4px 0}
.missing{display:inline-block;border:2px dashed #c0392b;color:#c0392b;background:#fdf0ee;
padding:18px 14px;margin:0 0 6px;font-family:monospace;font-size:12px;max-width:600px;
word-break:break-all}
.badge{background:#e67e22;color:#fff;border-radius:3px;padding:0 5px;font-size:11px}
.pos{color:#137a2e;font-weight:600}.neg{color:#b3261e;font-weight:600}
.diff{margin:6px 0;font-size:13px;line-height:1.7}.diff .label{color:#666;font-size:12px}
del.s,del.d{background:#fbd5d2;color:#8c1d18}ins.s,ins.i{background:#d3f2d9;color:#0f5c22;
text-decoration:none;margin-left:2px}del.d{text-decoration:line-through}
tr.differs>td{background:#fff3cd}
.note{color:#8a5a00;background:#fff6e0;padding:4px 8px;border-radius:4px;margin:4px 0}
.turn{border-left:3px solid #9db4d6;padding:2px 0 2px 8px;margin:6px 0}
.tlabel{font-size:12px;font-weight:600;color:#41526b}
.call{margin:4px 0 4px 10px}.chead{font-size:12.5px}.chead code{background:#eef1f5;padding:0 4px}
.tool-error{color:#b3261e;background:#fdf0ee;padding:3px 8px;border-radius:4px;margin:3px 0;
font-family:monospace;font-size:12px}.obs{font-size:12px;color:#666;margin:2px 0 2px 10px}
.tool-pics figure{margin:4px 0}.tool-pics img{vertical-align:top;margin-right:8px;max-width:100%}
.tool-pics figcaption{font-size:12px;color:#555}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px -2px 10px}
"""

OPEN_TARGET_JS = ("function openTarget(){var e=document.getElementById("
                  "decodeURIComponent(location.hash.slice(1)));"
                  "if(e&&e.tagName==='DETAILS'){e.open=true;e.scrollIntoView();}}"
                  "addEventListener('hashchange',openTarget);openTarget();")

# Shown first in the summary table: the before/after comparison a run exists to produce.
HEADLINE = ["accuracy_before_rl", "accuracy_after_rl", "accuracy_shuffled_images", "chance",
            "steps"]
CONFIG_KEYS = ["model.family", "model.path", "data.train", "data.format", "rollout.backend",
               "rollout.prompts_per_step", "rollout.num_generations", "rollout.max_new_tokens",
               "rollout.temperature", "rewards", "algo.preset", "algo.advantage", "algo.clip_low",
               "algo.clip_high", "algo.agg", "algo.ratio", "algo.beta", "algo.dynamic_sampling",
               "train.steps", "train.lr", "train.lr_schedule", "train.micro_batch_size",
               "train.seed"]


def _cell(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f'<td class="num">{fmt(v)}</td>'
    if isinstance(v, list) and len(v) > 8:
        v = f"[{len(v)} items]"  # per-sample lists in summary.json would swamp the table
    return f"<td>{esc(v if isinstance(v, str) else fmt(v) if v is None else repr(v))}</td>"


def _derived(run: Run) -> dict[str, Any]:
    """Numbers read off metrics.jsonl that summary.json does not hold."""
    out: dict[str, Any] = {"logged steps": len(run.metrics)}
    tail = [r.get("reward/total_mean") for r in run.metrics[-10:]]
    tail = [v for v in tail if isinstance(v, (int, float))]
    if tail:
        out["reward/total_mean (last 10 steps)"] = sum(tail) / len(tail)
    times = [r.get("time") for r in run.metrics if isinstance(r.get("time"), (int, float))]
    if len(times) > 1:
        out["wall time (min)"] = (max(times) - min(times)) / 60
    out["logged rollouts"] = len(run.rollouts)
    return out


def _rewards_value(v: Any) -> Any:
    if isinstance(v, list):  # [{name, weight}, ...] reads best as "iou×1.0, format×0.5"
        return ", ".join(f"{x.get('name')}×{x.get('weight', 1.0)}" if isinstance(x, dict)
                         else str(x) for x in v)
    return v


def _differs(tables: list[dict], key: str) -> str:
    """Highlight a row whose value is not the same in every run."""
    return ' class="differs"' if len({repr(t.get(key)) for t in tables}) > 1 else ""


def summary_section(runs: list[Run]) -> str:
    flat = [flatten(r.summary) for r in runs]
    keys = [k for k in HEADLINE if any(k in f for f in flat)]
    keys += sorted({k for f in flat for k in f} - set(keys))
    head = "<tr><th>metric</th>" + "".join(f"<th>{esc(r.name)}</th>" for r in runs) + "</tr>"
    rows = [f"<tr{_differs(flat, k)}><th>{esc(k)}</th>{''.join(_cell(f.get(k)) for f in flat)}"
            f"</tr>" for k in keys]
    derived = [_derived(r) for r in runs]
    rows += [f"<tr><th>{esc(k)}</th>{''.join(_cell(d.get(k)) for d in derived)}</tr>"
             for k in derived[0]]
    configs = [{k: _rewards_value(v) for k, v in flatten(r.config).items()} for r in runs]
    ckeys = [k for k in CONFIG_KEYS if any(k in c for c in configs)]
    if len(runs) > 1:  # comparing runs: every setting that differs belongs in the excerpt
        differing = {k for c in configs for k in c if _differs(configs, k)}
        ckeys += sorted(differing - set(ckeys))
    crow = [f"<tr{_differs(configs, k)}><th>{esc(k)}</th>"
            f"{''.join(_cell(c.get(k)) for c in configs)}</tr>" for k in ckeys]
    full = "".join(f"<details><summary>config.yaml of {esc(r.name)}</summary><pre>"
                   f"{esc(r.config_text or '(no config.yaml)')}</pre></details>" for r in runs)
    notes = "".join(f'<div class="note">{esc(r.name)}: {esc(p)}</div>'
                    for r in runs for p in r.problems)
    return (f'<section id="summary"><h2>Summary</h2>{notes}<table>{head}{"".join(rows)}'
            f'</table><h3>Config excerpt</h3><table>{head.replace("metric", "key")}'
            f'{"".join(crow) or "<tr><td>(no config.yaml)</td></tr>"}</table>{full}</section>')


def curves_section(runs: list[Run]) -> str:
    figures = []
    for group in curves.curve_groups(runs):
        png, labels = curves.plot_group(runs, group)
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        figures.append(f'<figure id="{group.anchor}"><img class="plot" src="{uri}" '
                       f'alt="{esc(group.title)}" data-labels="{esc("|".join(labels))}">'
                       f'</figure>')
    body = "".join(figures) or "<p>No numeric metrics logged.</p>"
    legend = ""
    if len(runs) > 1:
        legend = ("<p>Runs: " + ", ".join(
            f"<b>{esc(r.name)}</b> ({'solid dashed dotted dash-dot'.split()[i % 4]})"
            for i, r in enumerate(runs)) + "; colours are metrics.</p>")
    return f'<section id="curves"><h2>Curves</h2>{legend}<div class="grid">{body}</div></section>'


def rollouts_section(runs: list[Run], steps: list[int] | None, max_per_step: int) -> str:
    parts = []
    cache: dict = {}
    for i, run in enumerate(runs):
        chosen, notes = choose_steps(run.rollout_steps, steps)
        roots = [run.path, Path.cwd()]
        run_key = f"run{i}"
        parts.append(f'<h3 id="{run_key}">{esc(run.name)}</h3>')
        parts += [f'<div class="note">{esc(n)}</div>' for n in notes]
        if not chosen:
            parts.append("<p>No rollouts logged (rollouts.jsonl is empty or missing).</p>")
        links = " · ".join(f'<a href="#{run_key}-step-{s}">step {s}</a>' for s in chosen)
        if links:
            parts.append(f"<p>Steps: {links} (logged: {len(run.rollout_steps)} steps)</p>")
        for j, step in enumerate(chosen):
            rows = [r for r in run.rollouts if r.get("step") == step][:max_per_step]
            parts.append(step_html(step, rows, roots, cache, run_key, open_=j == 0,
                                   rule=parse.box_rule(run.config)))
    return f'<section id="rollouts"><h2>Rollouts</h2>{"".join(parts)}</section>'


def page(runs: list[Run], sections: list[str]) -> str:
    title = "mmrl report: " + " vs ".join(r.name for r in runs)
    nav = ('<a href="#summary">Summary</a><a href="#curves">Curves</a>'
           '<a href="#rollouts">Rollouts</a>')
    paths = " · ".join(esc(str(r.path)) for r in runs)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>{esc(title)}</title><style>{CSS}</style></head><body>'
            f'<header><h1>{esc(title)}</h1><nav>{nav}</nav>'
            f'<div style="font-size:12px;color:#aab">{paths}</div></header>'
            f'<main>{"".join(sections)}</main><script>{OPEN_TARGET_JS}</script></body></html>')
