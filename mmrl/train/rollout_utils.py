"""Helpers over rollout batches: concatenation (dynamic sampling), metrics, logged records."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mmrl import algos
from mmrl.types import RolloutBatch, ScoredBatch
from rewards import extract_answer
from rewards.format import text_after_answer


def concat_rollouts(pieces: list[tuple[RolloutBatch, torch.Tensor, dict]], pad_id: int):
    """[(batch, scores, per_reward)] -> one (batch, scores, per_reward), completions re-padded."""
    batch = RolloutBatch.cat([b for b, _, _ in pieces], pad_id)
    scores = torch.cat([s for _, s, _ in pieces])
    per = {k: [v for _, _, p in pieces for v in p[k]] for k in pieces[0][2]}
    return batch, scores, per


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def rollout_metrics(sb: ScoredBatch, reward_keys: list[str]) -> dict[str, float]:
    b = sb.rollout
    lengths = b.completion_mask.sum(1).float()
    m = {
        "reward/total_mean": float(sb.scores.mean()), "reward/total_std": float(sb.scores.std())
        if b.n > 1 else 0.0, "reward/total_max": float(sb.scores.max()),
        "reward/total_min": float(sb.scores.min()),
        "adv/mean": float(sb.advantages.mean()), "adv/std": float(sb.advantages.std())
        if b.n > 1 else 0.0, "adv/abs_mean": float(sb.advantages.abs().mean()),
        "completion/length_mean": float(lengths.mean()), "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": float(b.truncated.float().mean()),
        "completion/cut_after_answer_frac": cut_after_answer_frac(b.texts, b.truncated.tolist()),
        "groups/zero_std_frac": float(algos.frac_zero_std_groups(sb.scores, b.group_ids)),
        "groups/solved_frac": float(algos.frac_solved_groups(sb.scores, b.group_ids)),
    }
    for key in reward_keys:
        applicable = [v for v in sb.per_reward[key] if v is not None]
        m[f"reward/{key}_mean"], m[f"reward/{key}_std"] = _mean_std(applicable)
    return m


def cut_after_answer_frac(texts: list[str], truncated: list[bool]) -> float:
    """The share of completions cut at the token limit after a whole answer: the policy wrote on
    past `</answer>` instead of ending (watch.CutWatch; the learning table's cut-with-text column).

    >>> cut_after_answer_frac(["<answer>C</answer>C</answer", "<answer>C</answer>", "<answer>C"],
    ...                       [True, False, True])
    0.3333333333333333
    """
    hits = sum(bool(cut and text_after_answer(t)) for t, cut in zip(texts, truncated))
    return hits / len(texts) if texts else 0.0


def rollout_records(sb: ScoredBatch, limit: int, media_dir: Path | None = None) -> list[dict]:
    """The first `limit` rows (whole groups first) as JSON-able records for rollouts.jsonl.
    Media are referenced by path, never copied; an environment's observations, which have no
    original file, are written under `media_dir` (when given) for the report to draw."""
    b = sb.rollout
    out = []
    for i in range(min(limit, b.n)):
        s = b.prompts[i].sample
        out.append({
            "sample_id": s.id, "task": s.task, "group": int(b.group_ids[i]),
            "prompt": _prompt_text(s.messages), "images": s.images, "videos": s.videos,
            "audios": s.audios, "completion": b.texts[i], "answer": extract_answer(b.texts[i]),
            "solution": s.solution, "fields": s.fields,
            "rewards": {k: v[i] for k, v in sb.per_reward.items()},
            "reward": float(sb.scores[i]), "advantage": float(sb.advantages[i]),
            "length": int(b.completion_mask[i].sum()), "truncated": bool(b.truncated[i]),
        })
        if b.trajectories is not None:  # turn by turn: what the model said, called and read
            out[-1].update(_trajectory_record(
                b.trajectories[i], media_dir and media_dir / f"row{i:03d}"))
    return out


def _trajectory_record(t, media_dir: Path | None = None) -> dict:
    """A trajectory's turns, calls (with their arguments, errors and what of the original media
    each read: `seen`, paths and boxes/spans) and observation texts, and the environment's info
    when it said any. A tool's returned media stay out (the report redraws them from the
    originals and `seen`); an environment's (a trajectory without calls: its world drew them)
    are written to `media_dir` and listed as each observation's `media`."""
    record = {"turns": list(t.turn_texts), "hit_turn_cap": t.hit_turn_cap,
            "calls": [{"name": c.name, "arguments": c.arguments, "turn": c.turn,
                       "error": c.error, "message": c.message, "seen": c.seen} for c in t.calls],
            "observations": [{"start": o.start, "length": o.length, "text": o.text}
                             for o in t.observations]}
    if media_dir is not None and not t.calls:
        for j, (o, rec) in enumerate(zip(t.observations, record["observations"])):
            rec["media"] = save_media(o.media, media_dir / f"obs{j}")
    if t.info:  # what JSON cannot hold is written as its str
        record["info"] = json.loads(json.dumps(t.info, default=str))
    return record


def save_media(media: dict, stem: Path) -> list[dict]:
    """An observation's media as files: each image a PNG, each clip its frames side by side in
    one PNG, each waveform a 16 kHz WAV -> [{"kind", "path", ...}] in that order."""
    from mmrl.data.synthetic_av import write_wav

    out = []
    if any(media.get(k) for k in ("images", "videos", "audios")):
        stem.parent.mkdir(parents=True, exist_ok=True)
    for k, image in enumerate(media.get("images") or []):
        path = stem.with_name(f"{stem.name}_image{k}.png")
        image.convert("RGB").save(path)
        out.append({"kind": "image", "path": str(path)})
    for k, video in enumerate(media.get("videos") or []):
        path = stem.with_name(f"{stem.name}_video{k}.png")
        frames = np.asarray(video.frames)
        Image.fromarray(np.concatenate(list(frames), axis=1)).save(path)
        out.append({"kind": "video", "path": str(path), "frames": len(frames),
                    "fps": float(video.fps)})
    for k, wave in enumerate(media.get("audios") or []):
        path = stem.with_name(f"{stem.name}_audio{k}.wav")
        wave = np.asarray(wave, dtype=np.float32)
        write_wav(path, wave, 16000)
        out.append({"kind": "audio", "path": str(path), "seconds": len(wave) / 16000})
    return out


def _prompt_text(messages: list[dict]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(c.get("text") or f"<{c.get('type')}>" for c in content or [])
    return " ".join(p for p in parts if p)
