"""Helpers over rollout batches: concatenation (dynamic sampling), metrics, logged records."""
from __future__ import annotations

import statistics

import torch

from mmrl import algos
from mmrl.types import RolloutBatch, ScoredBatch
from rewards import extract_answer


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
        if b.n > 1 else 0.0,
        "adv/mean": float(sb.advantages.mean()), "adv/std": float(sb.advantages.std())
        if b.n > 1 else 0.0, "adv/abs_mean": float(sb.advantages.abs().mean()),
        "completion/length_mean": float(lengths.mean()), "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": float(b.truncated.float().mean()),
        "groups/zero_std_frac": float(algos.frac_zero_std_groups(sb.scores, b.group_ids)),
    }
    for key in reward_keys:
        applicable = [v for v in sb.per_reward[key] if v is not None]
        m[f"reward/{key}_mean"], m[f"reward/{key}_std"] = _mean_std(applicable)
    return m


# Most completions cut at rollout.max_new_tokens for this many steps in a row: warned once.
CUT_FRAC, CUT_STEPS = 0.5, 10


class CutWatch:
    """Warns once when at least CUT_FRAC of the completions hit `rollout.max_new_tokens` for
    CUT_STEPS steps in a row. Either the budget is too short for the answers, or the policy has
    stopped ending them: after `</answer>` it writes on to the limit, which no reward sees when
    `format` allows text around the answer (think: false) -- GRPO's per-sequence mean penalises a
    long wrong completion less per token, so lengths drift up (the detection row lost its
    end-of-sequence token this way: 97% cut by step 230, docs/learning.md)."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens, self.run, self.warned = max_new_tokens, 0, False

    def __call__(self, cut_frac: float, warn) -> None:
        self.run = self.run + 1 if cut_frac >= CUT_FRAC else 0
        if self.run >= CUT_STEPS and not self.warned:
            self.warned = True
            warn(f"{cut_frac:.0%} of completions hit rollout.max_new_tokens "
                 f"({self.max_new_tokens}) for {self.run} steps in a row. If rollouts.jsonl shows "
                 f"whole answers with text after them, the policy stopped ending its answers: "
                 f"score the whole completion's shape (format with think: true or optional); "
                 f"else raise rollout.max_new_tokens")


def rollout_records(sb: ScoredBatch, limit: int) -> list[dict]:
    """The first `limit` rows (whole groups first) as JSON-able records for rollouts.jsonl.
    Media are referenced by path, never copied."""
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
