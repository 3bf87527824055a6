"""Held-out evaluation: greedy generation, the configured rewards, and the metric reward's mean as
`accuracy`. Also the shuffled-media control (images, videos and audio permuted across samples):
a model that really reads its inputs drops to chance there, one that guesses from text does not."""
from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console
from rich.progress import track

from mmrl.config import RewardSpec, RunConfig
from mmrl.data.media import MediaError
from mmrl.data.prepare import media_loader
from mmrl.rollout.environments import make_environments, prompt_features
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.trajectory import TrajectoryRollout
from mmrl.tools import call_fields, trajectory_metrics
from mmrl.train import dist
from mmrl.train.logging import json_safe
from mmrl.train.metrics import summarize
from mmrl.train.scoring import RewardSet, rewards_at, trajectory_fields
from mmrl.types import Sample, SamplingParams, Trajectory
from rewards import extract_answer

if TYPE_CHECKING:
    from mmrl.models.codec import Codec


def shuffle_media(samples: list[Sample], seed: int) -> list[Sample]:
    """Give every sample another sample's media: images, videos and audio, all from one donor (a
    derangement: nobody keeps its own). Media-derived fields a reward reads stay the sample's own
    (its `duration`, `image_size`), so only the pixels and sound lose their link to the answer."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    donor = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}
    return [dataclasses.replace(s, images=samples[donor[i]].images, videos=samples[donor[i]].videos,
                                audios=samples[donor[i]].audios) for i, s in enumerate(samples)]


def metric_rewards(cfg: RunConfig) -> RewardSet:
    """The run's rewards, plus the metric reward with default params if the run lacks it."""
    specs = list(cfg.rewards)
    if not any(s.name == cfg.eval.metric_reward for s in specs):
        specs.append(RewardSpec(name=cfg.eval.metric_reward, weight=0.0))
    return RewardSet(specs)


def row_metrics(rewards: RewardSet, name: str, per: dict[str, list]) -> list[float | None]:
    """Each row's score by the metric reward `name`. It may be routed per task (video_qa:
    accuracy by letter for multiple choice, by number for numerical): a row's metric is the
    score of the one that applies to it."""
    keys = [k for k, s in zip(rewards.keys, rewards.specs) if s.name == name]
    return [next((per[k][i] for k in keys if per[k][i] is not None), None)
            for i in range(len(per[keys[0]]))]


def _decode_chunk(samples, codec: Codec, load, cfg: RunConfig,
                  loop: TrajectoryRollout) -> tuple[list[Sample], list, int]:
    chunk, feats, failed = [], [], 0
    for s in samples:
        try:
            feats.append(prompt_features(loop.envs, codec, s, load))
            chunk.append(s)
        except MediaError:
            if not cfg.data.skips_bad_samples:
                raise
            failed += 1  # counted in the result's "failed"
    return chunk, feats, failed


def eval_loop(model, codec: Codec, cfg: RunConfig, envs=None) -> TrajectoryRollout:
    """The trajectory loop of held-out generation: the model's own generate (greedy unless
    eval.num_samples), the run's environments (`envs`: built once per run; None: built here),
    eval_max_turns for multi-turn ones."""
    envs = envs if envs is not None else make_environments(cfg, codec)
    return TrajectoryRollout.for_run(cfg, HFEngine(model, codec.processor), codec, envs,
                                     evaluation=True)


@torch.no_grad()
def evaluate(model, codec: Codec, samples: list[Sample], cfg: RunConfig, *,
             out_file: Path | None = None, shuffled: bool = False,
             info: dist.DistInfo | None = None, envs=None) -> dict:
    """Generate for every sample (greedy, or `eval.num_samples` draws at `eval.temperature`),
    score with the run's rewards, and report accuracy, pass@k and the task metrics. With `info`
    (every rank calls it), each rank draws its contiguous share of the samples and every rank
    gets the whole result; rank 0 writes `out_file`. `envs`: the run's environment kind (built
    once per run; None: built here)."""
    if shuffled:
        samples = shuffle_media(samples, cfg.train.seed)
    info = info or dist.DistInfo()
    n = len(samples)
    mine = samples[n * info.rank // info.world:n * (info.rank + 1) // info.world]
    was_training = model.training
    model.eval()
    rows, trajectories, failed = _draw_rows(eval_loop(model, codec, cfg, envs),
                                            mine, cfg)
    model.train(was_training)
    if info.enabled:  # in rank order, as one process would have drawn them
        parts = dist.all_gather_object(
            (rows, [_light(t) for t in trajectories], failed), info)
        rows = [r for part in parts for r in part[0]]
        trajectories = [t for part in parts for t in part[1]]
        failed = sum(part[2] for part in parts)
    if out_file is not None and info.main:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return _result(rows, trajectories, failed, cfg)


def _light(t: Trajectory) -> Trajectory:
    """A trajectory without its observations' media tensors (what the metrics read)."""
    return dataclasses.replace(t, observations=[
        dataclasses.replace(o, tensors={}, media={}) for o in t.observations])


def _draw_rows(loop: TrajectoryRollout, samples: list[Sample], cfg: RunConfig
               ) -> tuple[list[dict], list[Trajectory], int]:
    """(one row per draw, their trajectories when multi-turn (else none), samples that failed)."""
    ec, rewards = cfg.eval, metric_rewards(cfg)
    codec = loop.codec
    max_new = ec.max_new_tokens or cfg.rollout.max_new_tokens
    k, suppress, load = max(1, ec.num_samples), codec.placeholder_ids, \
        media_loader(cfg, codec.image_factor)
    rows, failed, trajectories = [], 0, []
    starts = range(0, len(samples), ec.batch_size)
    # A bar on a terminal only: logs of long evaluations stay clean.
    for start in track(starts, description="eval", transient=True, console=Console(stderr=True),
                       disable=not sys.stderr.isatty()):
        chunk, feats, bad = _decode_chunk(samples[start:start + ec.batch_size], codec,
                                          load, cfg, loop)
        failed += bad
        if not chunk:
            continue
        params = SamplingParams(num_generations=k, max_new_tokens=max_new,
                                temperature=ec.temperature, top_p=1.0, top_k=0, do_sample=k > 1,
                                suppress_ids=suppress)
        texts, fields, drawn_trajectories = _draw(feats, params, loop)
        drawn = [s for s in chunk for _ in range(k)]
        with rewards_at("evaluation"):
            totals, per = rewards.score(drawn, texts, {
                **fields, "max_completion_length": [max_new] * len(drawn)})
        metric = row_metrics(rewards, ec.metric_reward, per)
        for i, s in enumerate(drawn):
            rows.append({"id": s.id, "draw": i % k, "task": s.task, "completion": texts[i],
                         "answer": extract_answer(texts[i]), "solution": s.solution,
                         "fields": s.fields, "reward": totals[i],
                         "rewards": {key: v[i] for key, v in per.items()},
                         "metric": metric[i]})
            if drawn_trajectories is not None:  # what the model said and called, turn by turn
                t = drawn_trajectories[i]
                rows[-1].update(turns=t.turn_texts, calls=fields["calls"][i],
                                hit_turn_cap=t.hit_turn_cap, seen=[c.seen for c in t.calls])
                if t.info:
                    rows[-1]["info"] = t.info
                trajectories.append(t)
    return rows, trajectories, failed


@torch.no_grad()
def draw_texts(model, codec: Codec, samples: list[Sample], cfg: RunConfig,
               max_new_tokens: int, envs=None) -> list[str | None]:
    """One greedy completion per sample on the held-out evaluation's path (its batches, media
    loader, tools when configured); None for a sample whose media failed to load (a counted skip
    under data.on_bad_sample=skip). The field benchmarks (mmrl/benchmarks) score these."""
    suppress = codec.placeholder_ids
    load = media_loader(cfg, codec.image_factor)
    loop = eval_loop(model, codec, cfg, envs)
    params = SamplingParams(num_generations=1, max_new_tokens=max_new_tokens, temperature=1.0,
                            top_p=1.0, top_k=0, do_sample=False, suppress_ids=suppress)
    was_training, out = model.training, {}
    model.eval()
    for start in range(0, len(samples), cfg.eval.batch_size):
        chunk, feats, _ = _decode_chunk(samples[start:start + cfg.eval.batch_size], codec,
                                        load, cfg, loop)
        if chunk:
            texts = _draw(feats, params, loop)[0]
            out.update({id(s): t for s, t in zip(chunk, texts)})
    model.train(was_training)
    return [out.get(id(s)) for s in samples]


def _result(rows: list[dict], trajectories: list[Trajectory], failed: int,
            cfg: RunConfig) -> dict:
    ec, rewards, k = cfg.eval, metric_rewards(cfg), max(1, cfg.eval.num_samples)
    firsts = [r for r in rows if r["draw"] == 0]
    scored = [r["metric"] for r in firsts if r["metric"] is not None]
    result = {"accuracy": sum(scored) / len(scored) if scored else float("nan"),
              "n": len(firsts), "failed": failed,
              "reward_mean": sum(r["reward"] for r in firsts) / max(1, len(firsts))}
    if trajectories:
        result.update(trajectory_metrics([t for r, t in zip(rows, trajectories)
                                           if r["draw"] == 0], cfg.tools.enabled))
    if not scored:  # say why accuracy is NaN instead of printing a bare nan
        result["unscored_reason"] = _unscored_reason(ec.metric_reward, len(firsts), failed)
    for key in rewards.keys:
        vals = [r["rewards"][key] for r in firsts if r["rewards"][key] is not None]
        if vals:
            result[f"{key}_mean"] = sum(vals) / len(vals)
    iou_params = next((dict(s.params) for s in cfg.rewards if s.name == "iou"), None)
    if rows:
        result.update(summarize([{**r, "rewards": {"metric": r["metric"]}} for r in rows],
                                "metric", k, ec.pass_threshold, iou_params))
    return result


def _draw(feats, params: SamplingParams, loop: TrajectoryRollout):
    """-> (final texts, reward fields, trajectories or None) of k draws per prompt through the
    trajectory loop: one turn of the model's generate for single-turn, else trajectories."""
    batch = loop.rollout(feats, params)
    if batch.trajectories is None:
        return batch.texts, {"completion_length": batch.completion_mask.sum(1).tolist(),
                             "info": [{} for _ in batch.texts]}, None
    return batch.texts, {"completion_length": batch.policy_mask.sum(1).tolist(),
                         **trajectory_fields(batch.trajectories)}, batch.trajectories


def _unscored_reason(metric: str, n: int, failed: int) -> str:
    why = (": every one failed to load (data.on_bad_sample=skip; `mmrl data inspect FILE` lists "
           "why)" if failed and not n else
           " (it returned None for each: check the fields it needs with `mmrl data inspect "
           "FILE --config CONFIG`)")
    return f"reward {metric!r} scored none of the {n + failed} eval records{why}"


def majority_baseline(samples: list[Sample]) -> float:
    """Accuracy of always answering the most frequent solution: the strongest input-blind guess."""
    counts: dict[str, int] = {}
    for s in samples:
        counts[str(s.solution)] = counts.get(str(s.solution), 0) + 1
    return max(counts.values()) / len(samples) if samples else float("nan")


def load_checkpoint(cfg: RunConfig, checkpoint: str):
    """(model, codec, checkpoint dir) of a saved model; sharded ZeRO-3 / FSDP2
    checkpoints are consolidated once beside it; a run dir means its latest checkpoint."""
    from mmrl.models import get_adapter
    from mmrl.models.codec import Codec
    from mmrl.train.checkpoint import has_weights, latest
    from mmrl.train.consolidate import consolidate, sharded_kind
    from mmrl.train.policy import DTYPES

    if (Path(checkpoint) / "checkpoints").is_dir():  # a run dir
        last = latest(Path(checkpoint))
        if last is None:
            raise SystemExit(f"mmrl eval: {checkpoint} holds no checkpoint yet")
        checkpoint = str(last)
    adapter = get_adapter(cfg.model.family)
    if sharded_kind(checkpoint) and not has_weights(Path(checkpoint)):  # ZeRO-3 / FSDP2 shards
        merged = Path(f"{checkpoint}_hf")
        if not merged.is_dir():
            print(f"consolidating sharded {checkpoint} -> {merged}")
            consolidate(Path(checkpoint), merged)
        checkpoint = str(merged)
    model, processor = adapter.load(checkpoint, dtype=DTYPES[cfg.model.dtype],
                                    attn_implementation=cfg.model.attn_implementation)
    if torch.cuda.is_available():
        model.cuda()
    return model, Codec(adapter, processor), checkpoint


def evaluate_checkpoint(cfg: RunConfig, checkpoint: str, out_dir: str | None = None) -> dict:
    """`mmrl eval`: greedy generation over `data.eval` with a saved model; writes
    predictions.jsonl and metrics.json into `out_dir` (default CHECKPOINT/eval)."""
    from mmrl.data.prepare import build_datasets
    from mmrl.models import get_adapter

    if not cfg.data.eval:
        raise SystemExit("mmrl eval: the config has no data.eval; pass data.eval=PATH")
    _, samples = build_datasets(cfg, get_adapter(cfg.model.family).image_factor)  # data first
    model, codec, checkpoint = load_checkpoint(cfg, checkpoint)
    out = Path(out_dir) if out_dir else Path(checkpoint) / "eval"
    result = evaluate(model, codec, samples, cfg, out_file=out / "predictions.jsonl")
    if cfg.eval.shuffled_images:
        result["accuracy_shuffled_images"] = evaluate(
            model, codec, samples, cfg, shuffled=True)["accuracy"]
    (out / "metrics.json").write_text(json.dumps(json_safe(result), indent=2, allow_nan=False))
    return result
