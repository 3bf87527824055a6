"""Held-out evaluation: greedy generation, the configured rewards, and the metric reward's mean as
`accuracy`. Also the shuffled-image control (images permuted across samples): a model that
really reads pixels drops to chance there, one that guesses from text does not."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch

from mmrl.config import RewardSpec, RunConfig
from mmrl.data.media import MediaError
from mmrl.models.forward import generate
from mmrl.train.scoring import RewardSet
from mmrl.train.setup import media_loader
from mmrl.types import Sample
from rewards import extract_answer


def shuffle_media(samples: list[Sample], seed: int) -> list[Sample]:
    """Give every sample another sample's images (a derangement: nobody keeps its own)."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    donor = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}
    return [dataclasses.replace(s, images=samples[donor[i]].images) for i, s in enumerate(samples)]


def metric_rewards(cfg: RunConfig) -> RewardSet:
    """The run's rewards, plus the metric reward with default params if the run lacks it."""
    specs = list(cfg.rewards)
    if not any(s.name == cfg.eval.metric_reward for s in specs):
        specs.append(RewardSpec(name=cfg.eval.metric_reward, weight=0.0))
    return RewardSet(specs)


@torch.no_grad()
def evaluate(model, processor, adapter, samples: list[Sample], cfg: RunConfig, *,
             out_file: Path | None = None, shuffled: bool = False, desc: str = "eval") -> dict:
    if shuffled:
        samples = shuffle_media(samples, cfg.train.seed)
    rewards = metric_rewards(cfg)
    metric_key = rewards.keys[[s.name for s in rewards.specs].index(cfg.eval.metric_reward)]
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    suppress = adapter.placeholder_token_ids(processor)
    load = media_loader(cfg)
    was_training = model.training
    model.eval()
    rows, failed = [], 0
    for start in range(0, len(samples), cfg.eval.batch_size):
        chunk, feats = [], []
        for s in samples[start:start + cfg.eval.batch_size]:
            try:
                feats.append(adapter.prompt_features(processor, s, **load(s)))
                chunk.append(s)
            except MediaError:
                if cfg.data.on_bad_sample != "skip":
                    raise
                failed += 1
        if not chunk:
            continue
        ids, mask, _, _ = generate(model, processor, feats, num_generations=1,
                                   max_new_tokens=max_new, temperature=1.0, top_p=1.0, top_k=0,
                                   do_sample=False, suppress_ids=suppress)
        texts = processor.tokenizer.batch_decode([r[m.bool()] for r, m in zip(ids, mask)],
                                                 skip_special_tokens=True)
        totals, per = rewards.score(chunk, texts, {"completion_length": mask.sum(1).tolist(),
                                                   "max_completion_length": [max_new] * len(chunk)})
        for i, s in enumerate(chunk):
            rows.append({"id": s.id, "completion": texts[i], "answer": extract_answer(texts[i]),
                         "solution": s.solution, "reward": totals[i],
                         "rewards": {k: v[i] for k, v in per.items()}})
    model.train(was_training)
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scored = [r["rewards"][metric_key] for r in rows if r["rewards"][metric_key] is not None]
    result = {"accuracy": sum(scored) / len(scored) if scored else float("nan"),
              "n": len(rows), "failed": failed,
              "reward_mean": sum(r["reward"] for r in rows) / max(1, len(rows))}
    for key in rewards.keys:
        vals = [r["rewards"][key] for r in rows if r["rewards"][key] is not None]
        if vals:
            result[f"{key}_mean"] = sum(vals) / len(vals)
    return result


def majority_baseline(samples: list[Sample]) -> float:
    """Accuracy of always answering the most frequent solution: the strongest input-blind guess."""
    counts: dict[str, int] = {}
    for s in samples:
        counts[str(s.solution)] = counts.get(str(s.solution), 0) + 1
    return max(counts.values()) / len(samples) if samples else float("nan")


def evaluate_checkpoint(cfg: RunConfig, checkpoint: str, out_dir: str | None = None) -> dict:
    """`mmrl eval`: greedy generation over `data.eval` with a saved model; writes
    predictions.jsonl and metrics.json into `out_dir` (default CHECKPOINT/eval)."""
    from mmrl.models import get_adapter
    from mmrl.train.setup import DTYPES, build_datasets

    if not cfg.data.eval:
        raise SystemExit("mmrl eval: the config has no data.eval; pass data.eval=PATH")
    _, samples = build_datasets(cfg)
    adapter = get_adapter(cfg.model.family)
    model, processor = adapter.load(checkpoint, dtype=DTYPES[cfg.model.dtype],
                                    attn_implementation=cfg.model.attn_implementation)
    if torch.cuda.is_available():
        model.cuda()
    out = Path(out_dir) if out_dir else Path(checkpoint) / "eval"
    result = evaluate(model, processor, adapter, samples, cfg, out_file=out / "predictions.jsonl")
    if cfg.eval.shuffled_images:
        result["accuracy_shuffled_images"] = evaluate(
            model, processor, adapter, samples, cfg, shuffled=True)["accuracy"]
    (out / "metrics.json").write_text(json.dumps(result, indent=2))
    return result
