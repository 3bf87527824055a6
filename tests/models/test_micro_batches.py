"""Token-budget micro-batches: the packing (groups whole, cut when over the budget, padded
layouts longest-first, the varlen layout balanced, a minimum count), and the point of it: on a
mixed batch (images, a short and a long video) the loss and every gradient equal those of
row-count micro-batches to 1e-6 for each aggregation, because the normaliser is global."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl import algos
from mmrl.models import get_adapter, prefix_attention
from mmrl.models.forward import collate, completion_logprobs
from mmrl.models.shared_prefix import shared_prefix_logprobs, token_budget_micro_batches
from mmrl.types import Sample


class _P:  # stands in for PromptFeatures: only input_ids' length is read
    def __init__(self, n):
        self.tensors = {"input_ids": torch.zeros(1, n, dtype=torch.long)}


def _flat(batches):
    return sorted(i for b in batches for i in b)


def test_groups_stay_whole_within_the_budget():
    a, b, c = _P(100), _P(50), _P(300)
    prompts = [a] * 4 + [b] * 4 + [c] * 4
    mask = torch.ones(12, 10)
    # Group costs 140, 90, 340: varlen (unpadded) packs a and b together; c's prompt alone
    # exceeds the budget, so each of its rows is a micro-batch of its own.
    batches = token_budget_micro_batches(prompts, mask, 250, padded=False)
    assert sorted(batches) == [[0, 1, 2, 3, 4, 5, 6, 7], [8], [9], [10], [11]]
    assert token_budget_micro_batches(prompts, mask, 1000, padded=False) == [list(range(12))]
    # Padded (dense mask): a batch costs groups x longest: 2 x 140 > 250, so a and b apart.
    padded = token_budget_micro_batches(prompts, mask, 250)
    assert [0, 1, 2, 3] in padded and [4, 5, 6, 7] in padded


def test_a_group_over_the_budget_is_cut_into_runs_that_fit():
    prompts = [_P(50)] * 6
    mask = torch.ones(6, 20)
    batches = token_budget_micro_batches(prompts, mask, 100, padded=False)
    assert sorted(batches) == [[0, 1], [2, 3], [4, 5]]  # 50 + 2 x 20 each
    lone = token_budget_micro_batches([_P(500)], torch.ones(1, 5), 100)
    assert lone == [[0]]  # one row over the budget: a micro-batch alone


def test_naive_rows_go_longest_first_and_bound_padding():
    prompts = [_P(100), _P(10), _P(100), _P(10), _P(50)]
    batches = token_budget_micro_batches(prompts, torch.ones(5, 10), 230, shared_prefix=False)
    assert batches == [[0, 2], [1, 3, 4]]  # 2 x 110 | 3 x 60


def test_unpadded_packing_balances_and_honours_a_minimum_count():
    prompts = [_P(1)] * 8
    mask = (torch.arange(10)[None] < torch.tensor([9, 1, 1, 1, 5, 5, 3, 3])[:, None]).long()
    batches = token_budget_micro_batches(prompts, mask, 20, shared_prefix=False, padded=False)
    loads = sorted(sum(int(mask[i].sum()) + 1 for i in b) for b in batches)
    assert len(batches) == 2 and loads == [18, 18]
    assert len(token_budget_micro_batches(prompts, mask, 1000, shared_prefix=False, padded=False,
                                          min_batches=3)) == 3
    assert len(token_budget_micro_batches(prompts, mask, 1000, shared_prefix=False,
                                          min_batches=3)) == 3
    assert len(token_budget_micro_batches(prompts[:2], mask[:2], 1000, shared_prefix=False,
                                          min_batches=5)) == 2  # at most one per item


# ----------------------------------------------------------------------------- equality --------

G, WIDTH = 4, 8


@pytest.fixture(scope="module")
def mixed():
    """Two image prompts, a short and a long video: rows of very different lengths."""
    adapter = get_adapter("qwen2_5_vl")
    model, processor = adapter.tiny(seed=0, num_hidden_layers=2)

    def prompt(i, kind, **media):
        sample = Sample(id=f"m{i}", messages=[{"role": "user", "content": [
            {"type": kind}, {"type": "text", "text": "What is shown?"}]}])
        return adapter.prompt_features(processor, sample, **media)

    rng = np.random.default_rng(0)
    prompts = [prompt(0, "image", images=[Image.new("RGB", (56, 56), "red")]),
               prompt(1, "video", videos=[rng.integers(0, 256, (4, 56, 56, 3), dtype=np.uint8)], video_fps=2.0),
               prompt(2, "image", images=[Image.new("RGB", (84, 56), "blue")]),
               prompt(3, "video", videos=[rng.integers(0, 256, (16, 112, 84, 3), dtype=np.uint8)], video_fps=2.0)]
    rows = [p for p in prompts for _ in range(G)]
    pad = processor.tokenizer.pad_token_id
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 700, (len(rows), WIDTH), generator=gen)
    lengths = torch.randint(1, WIDTH + 1, (len(rows),), generator=gen)
    mask = (torch.arange(WIDTH)[None] < lengths[:, None]).long()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad))
    adv = torch.randn(len(rows), generator=gen)
    return model, rows, ids, mask, pad, adv


def _forward(model, rows, ids, mask, pad, index, layout):
    sub, i, m = [rows[k] for k in index], ids[index], mask[index]
    if layout == "naive":
        return completion_logprobs(model, collate(sub, i, m, pad), i, m)
    return shared_prefix_logprobs(model, sub, i, m, pad_id=pad)


def _update(model, rows, ids, mask, pad, adv, batches, layout, agg):
    """One update: clipped surrogate per token, aggregated with the global normaliser, one
    backward per micro-batch; returns (summed loss, gradients)."""
    with torch.no_grad():
        old = _forward(model, rows, ids, mask, pad, list(range(len(rows))), layout) - 0.05
    fmask = mask.float()
    normalizer = algos.loss_normalizer(fmask, agg)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for index in batches:
        logp = _forward(model, rows, ids, mask, pad, index, layout)
        ratio = torch.exp(logp - old[index])
        a = adv[index, None]
        per_token = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
        loss = algos.aggregate_loss(per_token, fmask[index], agg, max_len=WIDTH, normalizer=normalizer)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("layout", ["naive", "shared", "varlen"])
def test_token_budget_equals_row_count_micro_batches(mixed, layout, agg):
    model, rows, ids, mask, pad, adv = mixed
    saved = model.config._attn_implementation
    if layout == "varlen":
        model.set_attn_implementation(prefix_attention.NAME)
    try:
        n = len(rows)
        by_rows = [list(range(i, min(n, i + 3))) for i in range(0, n, 3)]  # cuts every group
        by_tokens = token_budget_micro_batches(rows, mask, 200, shared_prefix=layout != "naive",
                                               padded=layout != "varlen")
        assert sorted(i for b in by_tokens for i in b) == list(range(n))
        assert sorted(by_tokens) != by_rows
        loss_r, grads_r = _update(model, rows, ids, mask, pad, adv, by_rows, layout, agg)
        loss_t, grads_t = _update(model, rows, ids, mask, pad, adv, by_tokens, layout, agg)
    finally:
        model.set_attn_implementation(saved)
    assert loss_t == pytest.approx(loss_r, abs=1e-6)
    assert grads_r.keys() == grads_t.keys() and len(grads_r) >= 50
    worst = max(float((grads_r[k] - grads_t[k]).norm() / grads_r[k].norm().clamp(min=1e-20)) for k in grads_r)
    assert worst <= 1e-6, worst
