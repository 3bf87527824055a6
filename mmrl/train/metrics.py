"""Task metrics for evaluation, as the field reports them, computed by the reference libraries
behind `rewards` (sacrebleu, jiwer) from per-sample predictions.

    detection / rec     ACC@0.5 (IoU >= 0.5) and mIoU
    temporal_grounding  R1@{0.3, 0.5, 0.7} and mIoU
    asr                 corpus WER and CER (jiwer)
    captioning / speech_translation / translation   corpus BLEU (sacrebleu)
    classification      mean Jaccard
    everything          accuracy (the metric reward's mean) and pass@k for k <= samples
"""
from __future__ import annotations

from math import comb

from rewards import corpus_bleu, corpus_error_rate, get_reward, temporal_grounding_metrics

BOX_TASKS = {"detection", "rec", "grounding", "referring"}
TEXT_TASKS = {"captioning", "speech_translation", "translation"}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _fields(rows: list[dict]) -> dict[str, list]:
    keys = sorted({k for r in rows for k in r.get("fields", {})})
    return {k: [r.get("fields", {}).get(k) for r in rows] for k in keys}


def task_metrics(task: str, rows: list[dict], iou_params: dict | None = None) -> dict[str, float]:
    """Metrics for one task's rows ({"completion", "solution", "fields"}; first sample only)."""
    completions = [r["completion"] for r in rows]
    solutions = [r["solution"] for r in rows]
    out: dict[str, float] = {}
    if task in BOX_TASKS:
        ious = [v or 0.0 for v in get_reward("iou")(completions, solutions, **(iou_params or {}),
                                                     **_fields(rows))]
        out["acc@0.5"] = sum(v >= 0.5 for v in ious) / len(ious)
        out["miou"] = sum(ious) / len(ious)
    elif task == "temporal_grounding":
        tg = temporal_grounding_metrics(completions, solutions)
        out.update({k.lower(): v for k, v in tg.items()})
    elif task == "asr":
        out["wer"] = corpus_error_rate(completions, solutions, unit="word")
        out["cer"] = corpus_error_rate(completions, solutions, unit="char")
    elif task in TEXT_TASKS:
        out["bleu"] = corpus_bleu(completions, solutions)
    elif task == "classification":
        scores = get_reward("jaccard")(completions, solutions, **_fields(rows))
        out["jaccard"] = sum(v or 0.0 for v in scores) / len(scores)
    return out


def summarize(rows: list[dict], metric_key: str, k_max: int, pass_threshold: float = 1.0,
              iou_params: dict | None = None) -> dict[str, float]:
    """rows: one per (sample, draw) with "id", "draw", "task", "rewards". -> flat metrics."""
    by_id: dict[str, list[dict]] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    firsts = [draws[0] for draws in by_id.values()]
    out: dict[str, float] = {}
    for k in sorted({1, k_max}):
        vals = []
        for draws in by_id.values():
            scores = [d["rewards"].get(metric_key) for d in draws]
            if any(s is None for s in scores):
                continue
            vals.append(pass_at_k(len(draws), sum(s >= pass_threshold for s in scores), k))
        if vals:
            out[f"pass@{k}"] = sum(vals) / len(vals)
    for task in sorted({r["task"] for r in firsts}):
        sub = [r for r in firsts if r["task"] == task]
        out.update({f"{task}/{name}": v for name, v in task_metrics(task, sub, iou_params).items()})
    return out
