"""Optional supervised warm-up before RL: imitate `sft.target` (e.g. "<answer>3</answer>") on
training samples until held-out greedy accuracy reaches `sft.stop_accuracy`.

Why: a fresh tiny model never emits the answer format, so every group has zero reward variance
and RL has nothing to learn from. A short warm-up teaches the format; RL then improves accuracy.
Stop on a validation criterion, not a step count: greedy accuracy jumps within a few steps.
"""
from __future__ import annotations

import torch

from mmrl.data.media import MediaError
from mmrl.models.forward import collate, completion_logprobs
from mmrl.train import dist
from mmrl.train.evaluate import evaluate


def _targets(trainer, samples) -> tuple[torch.Tensor, torch.Tensor]:
    tok = trainer.processor.tokenizer
    rows = [tok(trainer.cfg.sft.target.format(solution=s.solution), add_special_tokens=False)
            ["input_ids"] + [tok.eos_token_id] for s in samples]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), trainer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


def _load(trainer, idx: list[int]) -> tuple[list, list]:
    """The batch's samples and features; bad media is skipped and counted like in RL when
    data.on_bad_sample=skip, else stops naming the record."""
    samples, feats = [], []
    for i in idx:
        try:
            feats.append(trainer.features(trainer.train_set[i], i))
            samples.append(trainer.train_set[i])
        except MediaError as e:
            if trainer.cfg.data.on_bad_sample != "skip":
                raise MediaError(f"{e}\n(set data.on_bad_sample=skip to skip such samples and "
                                 f"count them in metrics)") from None
            trainer.skipped += 1
    if not samples:
        raise MediaError(f"SFT warm-up: none of the {len(idx)} samples drawn could be loaded")
    return samples, feats


def sft_warmup(trainer) -> dict:
    sc, model = trainer.cfg.sft, trainer.model
    n_val = min(sc.val_samples, len(trainer.train_set) // 4)
    val = trainer.train_set[:n_val]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=sc.lr)
    gen = torch.Generator().manual_seed(trainer.cfg.train.seed + 1)
    history, acc, step = [], float("nan"), 0
    trainer.log.print(f"SFT warm-up: up to {sc.steps} steps, stop at val accuracy "
                      f"{sc.stop_accuracy}")
    for step in range(1, sc.steps + 1):
        idx = (torch.randint(n_val, len(trainer.train_set), (sc.batch_size,), generator=gen)).tolist()
        samples, feats = _load(trainer, idx)
        ids, mask = _targets(trainer, samples)
        model.train()
        inputs = collate(feats, ids, mask, trainer.pad_id)
        logp = completion_logprobs(model, {k: v.to(trainer.device) if torch.is_tensor(v) else v
                                           for k, v in inputs.items()},
                                   ids.to(trainer.device), mask.to(trainer.device))
        loss = -(logp * mask.to(logp.device)).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Every rank trains on the same batch; averaging keeps replicas bit-identical anyway.
        dist.all_reduce_grads([p for p in model.parameters() if p.requires_grad], trainer.dist,
                              average=True)
        opt.step()
        if step % sc.eval_every == 0 or step == sc.steps:
            acc = evaluate(model, trainer.processor, trainer.adapter, val, trainer.cfg)["accuracy"]
            history.append({"step": step, "loss": float(loss.detach()), "val_accuracy": acc})
            trainer.log.print(f"  sft step {step}: loss {float(loss.detach()):.3f}  val accuracy {acc:.3f}")
            if sc.stop_accuracy is not None and acc >= sc.stop_accuracy:
                break
    return {"steps": step, "val_accuracy": acc, "history": history}
