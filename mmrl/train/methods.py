"""Trainer glue for the methods from the papers (docs/methods.md).

Each function is called from one line of a stage of the loop (or of the part it belongs to),
with the parts it needs; the decisions themselves are pure functions in mmrl/algos and rewards/.
Every method is off unless its config key is set:

    PromptSource           HistoryFilter            algo.history_epochs (draw, observe, weight)
    Scorer.score           group ids for majority_vote rewards
    rollout stage          temporal_contrast, then inject_ground_truth   (after scoring)
    advantage stage        guided_scores, then PromptSource.weight_advantages
    metrics stage          label_free_metrics, think_metrics, PromptSource.end_step

The think / no-think instruction of data.think_hybrid is a data preparation rule
(mmrl/data/prepare.py); its metrics are here.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from mmrl import algos
from mmrl.config import AlgoConfig, RunConfig
from mmrl.data.pretext import shuffle_frames
from mmrl.types import RolloutBatch, Sample
from rewards.label_free import majority_error
from rewards.thinking import think_shares

if TYPE_CHECKING:
    from mmrl.train.generation import Rollout
    from mmrl.train.policy import Policy
    from mmrl.train.scoring import Scorer


# ------------------------------------------------------------- label-free rewards (TTRL) -------
def label_free_metrics(cfg: RunConfig, batch: RolloutBatch) -> dict[str, float]:
    """How often the group's majority answer is wrong where the sample has a label (the
    pseudo-label's error rate); only when a majority_vote reward is configured."""
    if not any(s.name == "majority_vote" for s in cfg.rewards):
        return {}
    known, wrong = majority_error(batch.texts, [p.sample.solution for p in batch.prompts],
                                  batch.group_ids.tolist())
    return {"label_free/labelled_groups": known,
            "label_free/majority_wrong": wrong / known if known else float("nan")}


# ------------------------------------------------------------- think / no-think (TON) ----------
def think_metrics(cfg: RunConfig, batch: RolloutBatch) -> dict[str, float]:
    """Shares of completions with a non-empty think block, an empty one, none (log.think_share
    or data.think_hybrid); with the hybrid, also the think share among each asked mode."""
    if not (cfg.log.think_share or cfg.data.think_hybrid > 0):
        return {}
    out = {f"think/{k}": v for k, v in think_shares(batch.texts).items()}
    asked = [p.sample.fields.get("think_mode") for p in batch.prompts]
    for mode in ("think", "no_think"):
        texts = [t for t, a in zip(batch.texts, asked) if a == mode]
        if texts:
            out[f"think/asked_{mode}_frac"] = len(texts) / batch.n
            out[f"think/think_when_asked_{mode}"] = think_shares(texts)["think"]
    return out


# ------------------------------------------------------------- history-aware filtering ---------
class HistoryFilter:
    """algo.history_epochs > 0: the PromptSource's record of which prompts were solved by all or
    none of their samples on their last k visits; such prompts are skipped when drawn (mode skip)
    or their advantages scaled by history_weight (mode downweight)."""

    def __init__(self, ac: AlgoConfig):
        self.history = algos.PromptHistory(ac.history_epochs)
        self.skip, self.downweight = ac.history_skips, ac.history_downweights
        self.weight = ac.history_weight
        self.stats: dict[str, int] = {}

    @classmethod
    def make(cls, ac: AlgoConfig) -> HistoryFilter | None:
        return cls(ac) if ac.history_epochs > 0 else None

    def skips(self, sample: Sample) -> bool:
        """Mode skip: True when this prompt is filtered (counted; the caller draws another). The
        skip is the prompt's rest: it is drawn again on its next pass (PromptHistory.rest), so a
        run whose every prompt is solved still has prompts to draw."""
        stats = self.stats
        stats["drawn"] = stats.get("drawn", 0) + 1
        if not self.skip or not self.history.filtered(sample.id):
            return False
        stats["skipped"] = stats.get("skipped", 0) + 1
        self.history.rest(sample.id)
        return True

    def observe(self, batch: RolloutBatch, scores: torch.Tensor) -> None:
        self.history.observe([p.sample.id for p in batch.prompts], scores, batch.group_ids)

    def advantages(self, adv: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """Mode downweight: advantages of filtered prompts' rows times history_weight."""
        if not self.downweight:
            return adv
        w = self.history.row_weights([p.sample.id for p in batch.prompts], self.weight)
        return adv * w.to(adv.dtype)

    def end_step(self) -> dict[str, float]:
        """Commit this step's groups; -> kept fraction of drawn prompts and filtered prompt count."""
        h = self.history
        h.commit()
        s, self.stats = self.stats, {}
        drawn = s.get("drawn", 0)
        return {"history/kept_frac": 1.0 - s.get("skipped", 0) / drawn if drawn else 1.0,
                "history/filtered": float(sum(map(h.filtered, h.flags)))}


# ------------------------------------------------------------- ground-truth guidance -----------
def inject_ground_truth(ac: AlgoConfig, policy: Policy, scorer: Scorer, batch: RolloutBatch,
                        scores: torch.Tensor, per: dict):
    """TempSamp-R1: in every group whose best reward < gt_threshold the last rollout becomes the
    ground truth in the recipe's answer format (plus EOS), rescored by the configured rewards;
    its sampler logprobs are the current policy's. -> (batch, scores, per, guided Bool[N],
    metrics). Samples without a solution are never guided."""
    guided = torch.zeros(batch.n, dtype=torch.bool)
    if ac.gt_threshold is None:
        return batch, scores, per, guided, {}
    rows = [r for r in algos.guidance_rows(scores, batch.group_ids, ac.gt_threshold)
            .nonzero().flatten().tolist() if batch.prompts[r].sample.solution is not None]
    n_groups = int(batch.group_ids.unique().numel())
    metrics = {"gt_guidance/fired_frac": len(rows) / max(n_groups, 1)}
    if not rows:
        return batch, scores, per, guided, metrics
    tok, pad_id = policy.codec.tokenizer, policy.codec.pad_id
    targets = [tok(ac.gt_template.format(solution=batch.prompts[r].sample.solution),
                   add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in rows]
    width = max(batch.completion_ids.shape[1], max(map(len, targets)))
    ids, mask = _widen(batch.completion_ids, width, pad_id), _widen(batch.completion_mask, width, 0)
    slogp = None if batch.sampler_logp is None else _widen(batch.sampler_logp, width, 0.0)
    texts, truncated = list(batch.texts), batch.truncated.clone()
    for r, t in zip(rows, targets):
        ids[r], mask[r] = pad_id, 0
        ids[r, :len(t)], mask[r, :len(t)] = torch.tensor(t), 1
        texts[r], truncated[r] = tok.decode(t, skip_special_tokens=True), False
    out = RolloutBatch(prompts=batch.prompts, completion_ids=ids, completion_mask=mask,
                       group_ids=batch.group_ids, sampler_logp=slogp, texts=texts,
                       truncated=truncated)
    if slogp is not None:  # off-policy row: "sampled" by the current policy, so ratio 1 at start
        slogp[rows] = policy.logprobs(out.select(rows))
    new_scores, new_per = scorer.score(out.select(rows))
    scores = scores.clone()
    scores[rows] = new_scores
    per = {k: list(v) for k, v in per.items()}
    for k, v in new_per.items():
        for r, x in zip(rows, v):
            per[k][r] = x
    guided[rows] = True
    return out, scores, per, guided, metrics


def guided_scores(ac: AlgoConfig, guided: torch.Tensor | None, scores: torch.Tensor,
                  group_ids: torch.Tensor) -> torch.Tensor:
    """The soft (asymmetric) reshaping of the guided groups' rewards, before advantages."""
    if guided is None or not bool(guided.any()):
        return scores
    if guided.numel() != scores.numel():
        raise RuntimeError(f"{guided.numel()} guided flags for {scores.numel()} rows")
    return algos.soft_guided_scores(scores, group_ids, guided, ac.gt_tau, ac.gt_alpha_pos,
                                    ac.gt_alpha_neg)


def _widen(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] >= width:
        return x.clone()
    pad = torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype)
    return torch.cat([x, pad], dim=1)


# ------------------------------------------------------------- temporal contrast (T-GRPO) ------
def temporal_contrast(cfg: RunConfig, step: int, policy: Policy, rollout: Rollout,
                      scorer: Scorer, batch: RolloutBatch, scores: torch.Tensor, per: dict):
    """Video-R1's T-GRPO: re-sample every video prompt with shuffled frames (a second G
    rollouts per video prompt: the extra cost), score both, add the bonus to the ordered rows'
    total reward. -> (scores, metrics). Shuffled rollouts are scored, never trained on."""
    ac = cfg.algo
    if ac.tgrpo_alpha <= 0:
        return scores, {}
    key = ac.tgrpo_reward or scorer.keys[0]
    if key not in scorer.keys:
        raise KeyError(f"algo.tgrpo_reward={key!r} is not a configured reward key "
                       f"({scorer.keys})")
    first: dict[int, int] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        if batch.prompts[i].sample.videos and g not in first:
            first[g] = i
    if not first:
        return scores, {"tgrpo/extra_rollout_frac": 0.0}
    t0 = time.perf_counter()
    seed = cfg.train.seed * 100_003 + step
    shuffled = []
    for g, i in first.items():
        p = batch.prompts[i]
        media = {**p.media, "videos": [shuffle_frames(v, seed + g) for v in p.media["videos"]]}
        feats = policy.codec.prompt_features(p.sample, **media)
        feats.media = media
        shuffled.append(feats)
    sb = rollout.generate(shuffled)
    s_gids = torch.tensor(list(first)).repeat_interleave(cfg.rollout.num_generations)
    _, s_per = scorer.score(sb)
    acc = torch.tensor([v or 0.0 for v in per[key]])
    s_acc = torch.tensor([v or 0.0 for v in s_per[key]])
    bonus = algos.temporal_bonus(acc, batch.group_ids, s_acc, s_gids, ac.tgrpo_alpha, ac.tgrpo_mu)
    return scores + bonus.to(scores.dtype), {
        "tgrpo/extra_rollout_frac": sb.n / batch.n,  # shuffled rows per trained row
        "tgrpo/win_frac": algos.contrast_win_frac(acc, batch.group_ids, s_acc, s_gids, ac.tgrpo_mu),
        "tgrpo/bonus_rows": float((bonus > 0).sum()), "tgrpo/shuffled_acc": float(s_acc.mean()),
        "time/tgrpo_rollout": time.perf_counter() - t0}
