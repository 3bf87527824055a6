"""Memory-light per-token log-probs and entropy from logits.

Vocabularies are large (~150k for Qwen), so ``logits.log_softmax(-1)`` materialises a second
[B, T, V] tensor (in float32 for bf16 logits: twice the logits' memory). Both helpers work on
chunks of rows, upcasting one chunk at a time to float32 for an accurate logsumexp.

    log p(x) = z_x - logsumexp(z)                   (selective_log_softmax)
    H(p)     = logsumexp(z) - sum_v softmax(z)_v z_v  (entropy_from_logits)

>>> import torch
>>> z = torch.zeros(2, 4)
>>> [round(v, 6) for v in selective_log_softmax(z, torch.tensor([0, 3])).tolist()]  # log(1/4)
[-1.386294, -1.386294]
>>> [round(v, 6) for v in entropy_from_logits(z).tolist()]  # uniform over 4: log 4
[1.386294, 1.386294]
"""
from __future__ import annotations

import torch
from torch import Tensor

# Rows per chunk are chosen so one float32 chunk is ~2**25 elements (128 MiB).
_CHUNK_ELEMENTS = 2**25


def _rows_per_chunk(vocab: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1; got {chunk_rows}")
        return chunk_rows
    return max(1, _CHUNK_ELEMENTS // max(vocab, 1))


def _acc_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def selective_log_softmax(logits: Tensor, index: Tensor, chunk_rows: int | None = None) -> Tensor:
    """log_softmax(logits)[..., index] without a full log_softmax copy.

    logits [..., V], index [...] (int) -> [...] in float32 (float64 if logits are float64).
    Differentiable w.r.t. ``logits``.
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(f"index {tuple(index.shape)} must equal logits.shape[:-1] {tuple(logits.shape[:-1])}")
    vocab = logits.shape[-1]
    flat, idx = logits.reshape(-1, vocab), index.reshape(-1, 1).long()
    step = _rows_per_chunk(vocab, chunk_rows)
    dtype = _acc_dtype(logits)
    out = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start : start + step].to(dtype)
        picked = chunk.gather(-1, idx[start : start + step]).squeeze(-1)
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    if not out:
        return logits.new_zeros(index.shape, dtype=dtype)
    return torch.cat(out).reshape(index.shape)


def entropy_from_logits(logits: Tensor, chunk_rows: int | None = None) -> Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum softmax(z) * z.

    logits [..., V] -> [...] in float32 (float64 for float64 input). Differentiable. The form
    avoids log(p), so -inf (masked) logits give neither a NaN value nor a NaN gradient, as long
    as each row has at least one finite logit.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    step = _rows_per_chunk(vocab, chunk_rows)
    dtype = _acc_dtype(logits)
    out = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start : start + step].to(dtype)
        p = torch.softmax(chunk, dim=-1)
        # 0 * -inf is NaN (and so is its gradient): use z = 0 where p == 0, which adds nothing.
        z = torch.where(p > 0, chunk, torch.zeros_like(chunk))
        out.append(torch.logsumexp(chunk, dim=-1) - (p * z).sum(-1))
    if not out:
        return logits.new_zeros(logits.shape[:-1], dtype=dtype)
    return torch.cat(out).reshape(logits.shape[:-1])
