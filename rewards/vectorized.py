"""Token-ID BLEU and edit distance / WER on tensors, for whole batches at once (CPU or GPU).

`token_bleu` follows TensorBLEU: n-grams by `unfold`, a batch-local n-gram dictionary by
`torch.unique(dim=0, return_inverse=True)`, counts by an offset `bincount`, and equals NLTK's
`sentence_bleu` on the same token lists (smoothing "floor" = NLTK `SmoothingFunction().method1`,
"none" = method0). On CPU, where a row-wise unique is ~100x slower than a 1-D one, the same
dictionary is built order by order from 1-D keys (`dictionary="prefix"`, the CPU default).

`edit_distance` / `token_wer` equal rapidfuzz / jiwer on the same sequences: Myers' bit-vector
algorithm (one int64 per sample) when the shorter side has <= 62 tokens, else a row-at-a-time DP.

Inputs are right-padded LongTensors [B, L] with explicit lengths, or lists of token lists.
"""
from __future__ import annotations

import sys
from typing import Sequence, Union

import torch

Tokens = Union[torch.Tensor, Sequence[Sequence[int]]]


def pad_batch(sequences: Tokens, lengths: torch.Tensor | None = None, pad_id: int = 0,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B, L] long, lengths [B] long) from lists or a padded tensor.

    For a tensor without `lengths`, a row ends at its first `pad_id` (right padding).

    >>> pad_batch([[5, 6, 7], [8]])
    (tensor([[5, 6, 7],
            [8, 0, 0]]), tensor([3, 1]))
    """
    if isinstance(sequences, torch.Tensor):
        tokens = sequences.long().to(device) if device is not None else sequences.long()
        if tokens.dim() != 2:
            raise ValueError(f"expected a [B, L] tensor, got shape {tuple(tokens.shape)}")
        if lengths is None:
            is_pad = tokens == pad_id
            first_pad = is_pad.int().argmax(dim=1)
            lengths = torch.where(is_pad.any(dim=1), first_pad, tokens.shape[1])
        return tokens, lengths.to(tokens.device).long()
    seqs = [list(s) for s in sequences]
    width = max((len(s) for s in seqs), default=0)
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            tokens[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    out_lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return tokens.to(device), out_lengths.to(device)


def _reference_batch(references, ref_lengths, pad_id, device):
    """References as [B, R, L] tokens, [B, R] lengths and a [B, R] "present" mask."""
    if isinstance(references, torch.Tensor):
        refs = references.long().to(device)
        if refs.dim() == 2:
            refs = refs[:, None, :]
            ref_lengths = None if ref_lengths is None else torch.as_tensor(ref_lengths)[:, None]
        batch, n_refs, width = refs.shape
        if ref_lengths is None:
            _, flat = pad_batch(refs.reshape(batch * n_refs, width), pad_id=pad_id)
            ref_lengths = flat.view(batch, n_refs)
        ref_lengths = torch.as_tensor(ref_lengths, device=refs.device).long()
        return refs, ref_lengths, torch.ones_like(ref_lengths, dtype=torch.bool)
    # Lists: one list of ints per sample, or a list of such lists (several references).
    nested = [r if r and isinstance(r[0], (list, tuple, torch.Tensor)) else [r] for r in references]
    n_refs = max((len(r) for r in nested), default=1)
    flat = [list(r[k]) if k < len(r) else [] for r in nested for k in range(n_refs)]
    tokens, lengths = pad_batch(flat, pad_id=pad_id, device=device)
    present = torch.tensor([[k < len(r) for k in range(n_refs)] for r in nested], device=device)
    return tokens.view(len(nested), n_refs, -1), lengths.view(len(nested), n_refs), present


class _NGrams:
    """The n-grams of one order at the valid positions (j + n <= length) of candidates and
    references, as flat arrays: sentence, reference index, start j, and the dictionary id."""

    def __init__(self, cand_len: torch.Tensor, ref_len: torch.Tensor, cand_width: int,
                 ref_width: int, n: int, prev: "_NGrams | None"):
        self.n = n
        if prev is None:  # every token position inside its sentence
            self.cand_at = _inside(cand_len, cand_width)  # flat index into cand [B, Lc]
            self.ref_at = _inside(ref_len, ref_width)  # flat index into refs [B, R, Lr]
            self.cand_sent, self.cand_j = self.cand_at // cand_width, self.cand_at % cand_width
            ref_row = self.ref_at // ref_width  # row of the flattened [B * R, Lr] references
            self.ref_sent, self.ref_which = ref_row // ref_len.shape[1], ref_row % ref_len.shape[1]
            self.ref_j = self.ref_at % ref_width
            self.cand_room, self.ref_room = cand_len[self.cand_sent], ref_len.reshape(-1)[ref_row]
            self.keep_cand = self.keep_ref = None
        else:  # a subset of the previous order's positions: those with room for one more token
            self.keep_cand = (prev.cand_j + n <= prev.cand_room).nonzero().squeeze(1)
            self.keep_ref = (prev.ref_j + n <= prev.ref_room).nonzero().squeeze(1)
            for name in ("cand_at", "cand_sent", "cand_j", "cand_room"):
                setattr(self, name, prev.__dict__[name].index_select(0, self.keep_cand))
            for name in ("ref_at", "ref_sent", "ref_which", "ref_j", "ref_room"):
                setattr(self, name, prev.__dict__[name].index_select(0, self.keep_ref))
        self.ids: torch.Tensor | None = None  # [n_cand + n_ref], set by a dictionary builder
        self.n_ids = 0
        self.low = self.width = 0  # token range, for the prefix builder's keys

    def last_tokens(self, cand: torch.Tensor, refs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The n-th token of each n-gram (candidates, references)."""
        shift = self.n - 1  # the n-th token sits n - 1 places after the start, same row
        return (cand.reshape(-1).index_select(0, self.cand_at + shift),
                refs.reshape(-1).index_select(0, self.ref_at + shift))


def _inside(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Flat indices of the positions j < length in a [..., width] grid."""
    inside = torch.arange(width, device=lengths.device) < lengths[..., None]
    return inside.reshape(-1).nonzero().squeeze(1)


def _ids_rows(grams: _NGrams, cand: torch.Tensor, refs: torch.Tensor, prev) -> None:
    """TensorBLEU's dictionary: `torch.unique(dim=0, return_inverse=True)` over n-gram rows
    (from `unfold`), each prefixed by its sentence index so that one dictionary serves the batch."""
    n = grams.n
    if cand.shape[1] < n or refs.shape[2] < n:
        # One side has no n-gram of this order, so nothing can match: one shared dummy id.
        grams.ids = grams.cand_j.new_zeros(grams.cand_j.numel() + grams.ref_j.numel())
        grams.n_ids = 1
        return
    cand_rows = cand.unfold(1, n, 1)[grams.cand_sent, grams.cand_j]  # [Nc, n]
    ref_rows = refs.unfold(2, n, 1)[grams.ref_sent, grams.ref_which, grams.ref_j]  # [Nr, n]
    rows = torch.cat([torch.cat([grams.cand_sent[:, None], cand_rows], 1),
                      torch.cat([grams.ref_sent[:, None], ref_rows], 1)])
    if rows.shape[0]:
        unique, grams.ids = torch.unique(rows, dim=0, return_inverse=True)
        grams.n_ids = unique.shape[0]
    else:
        grams.ids, grams.n_ids = rows.new_zeros(0), 0


def _ids_prefix(grams: _NGrams, cand: torch.Tensor, refs: torch.Tensor, prev) -> None:
    """The same ids built a token at a time: id(n-gram) = rank of id(prefix) * V + last token,
    one 1-D sort per order instead of a row-wise unique (about 100x slower on CPU)."""
    if prev is None:  # the token range, once for all orders
        grams.low = int(torch.minimum(cand.min(), refs.min()))
        grams.width = int(torch.maximum(cand.max(), refs.max())) - grams.low + 1
    else:
        grams.low, grams.width = prev.low, prev.width
    low, width = grams.low, grams.width
    n_prefix = prev.n_ids if prev is not None else cand.shape[0]
    if n_prefix * width >= 2 ** 62:
        return _ids_rows(grams, cand, refs, prev)  # the keys would overflow int64
    last_cand, last_ref = grams.last_tokens(cand, refs)
    if prev is None:  # unigrams: the prefix is the sentence index
        cand_prefix, ref_prefix = grams.cand_sent, grams.ref_sent
    else:  # the (n-1)-gram at the same start, from the previous order's ids
        n_prev_cand = prev.cand_j.numel()
        cand_prefix = prev.ids[:n_prev_cand].index_select(0, grams.keep_cand)
        ref_prefix = prev.ids[n_prev_cand:].index_select(0, grams.keep_ref)
    keys = torch.cat([cand_prefix * width + (last_cand - low),
                      ref_prefix * width + (last_ref - low)])
    grams.ids, grams.n_ids = _unique_inverse(keys)


def _unique_inverse(keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`torch.unique(keys, return_inverse=True)` ids via a stable (radix, for integers) sort,
    about twice as fast on CPU; ids are ranks of the sorted distinct keys, as torch.unique's."""
    if keys.numel() == 0:
        return keys.clone(), 0
    sorted_keys, order = torch.sort(keys, stable=True)
    new_group = torch.ones_like(sorted_keys, dtype=torch.bool)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=new_group[1:])
    ranks = torch.cumsum(new_group, dim=0) - 1
    inverse = torch.empty_like(ranks).scatter_(0, order, ranks)  # scatter_: ~10x index_put_
    return inverse, int(ranks[-1]) + 1


def _clipped_counts(grams: _NGrams, batch: int, n_refs: int) -> torch.Tensor:
    """Clipped n-gram matches per sentence [B]: min(count in candidate, max count in a reference)
    summed over the candidate's distinct n-grams."""
    device, n_ids = grams.cand_j.device, grams.n_ids
    n_cand = grams.cand_j.shape[0]
    cand_ids, ref_ids = grams.ids[:n_cand], grams.ids[n_cand:]
    cand_counts = torch.bincount(cand_ids, minlength=n_ids)
    # Offset bincount: reference k's counts live in bins [k * U, (k + 1) * U).
    ref_counts = torch.bincount(grams.ref_which * n_ids + ref_ids, minlength=n_refs * n_ids)
    clipped = torch.minimum(cand_counts, ref_counts.view(n_refs, n_ids).max(dim=0).values)
    # Each id belongs to one sentence (the sentence index is part of the key).
    sentence = torch.zeros(n_ids, dtype=torch.long, device=device)
    sentence.scatter_(0, cand_ids, grams.cand_sent)
    return torch.zeros(batch, dtype=torch.long, device=device).scatter_add_(0, sentence, clipped)


_DICTIONARIES = {"rows": _ids_rows, "prefix": _ids_prefix}


def _brevity_penalty(cand_len: torch.Tensor, ref_len: torch.Tensor, present: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """NLTK's brevity penalty against the closest reference length (ties: the shorter one)."""
    distance = (ref_len - cand_len[:, None]).abs() * (ref_len.max() + 1) + ref_len
    distance = torch.where(present, distance, torch.iinfo(torch.long).max)
    closest = ref_len.gather(1, distance.argmin(dim=1, keepdim=True)).squeeze(1).to(dtype)
    hyp_len = cand_len.to(dtype)
    brevity = torch.exp(1 - closest / hyp_len.clamp(min=1))
    brevity = torch.where(hyp_len > closest, torch.ones_like(hyp_len), brevity)
    return torch.where(hyp_len == 0, torch.zeros_like(hyp_len), brevity)


def token_bleu(candidates: Tokens, references: Tokens, *, cand_lengths: torch.Tensor | None = None,
               ref_lengths: torch.Tensor | None = None, pad_id: int = 0, max_n: int = 4,
               weights: Sequence[float] | None = None, smoothing: str = "floor",
               epsilon: float = 0.1, dictionary: str = "auto",
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Sentence BLEU per pair [B] on token IDs, equal to NLTK `sentence_bleu`.

    `references`: [B, L] (one each), [B, R, L] (R each), or lists (of lists) of ints.
    `smoothing`: "floor" (NLTK method1: a zero count becomes `epsilon`) or "none" (method0).
    `dictionary`: "rows" (TensorBLEU's `torch.unique(dim=0)` over n-gram rows), "prefix" (1-D
    unique on prefix-id keys; same ids, far faster on CPU), "auto" (rows on CUDA, else prefix).

    >>> token_bleu([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9]], [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])
    tensor([1.0000, 0.2659], dtype=torch.float64)
    """
    if smoothing not in ("floor", "none"):
        raise ValueError(f"smoothing must be 'floor' or 'none', got {smoothing!r}")
    weights = list(weights) if weights is not None else [1.0 / max_n] * max_n
    cand, cand_len = pad_batch(candidates, cand_lengths, pad_id)
    refs, ref_len, present = _reference_batch(references, ref_lengths, pad_id, cand.device)
    if refs.shape[0] != cand.shape[0]:
        raise ValueError(f"{cand.shape[0]} candidates but {refs.shape[0]} reference sets")
    if dictionary == "auto":
        dictionary = "rows" if cand.is_cuda else "prefix"
    if dictionary not in _DICTIONARIES:
        raise ValueError(f"dictionary must be 'auto', 'rows' or 'prefix', got {dictionary!r}")
    build_ids = _DICTIONARIES[dictionary]
    # At least one column, so that the token range (min / max) is defined for empty batches.
    cand = torch.nn.functional.pad(cand, (0, max(0, 1 - cand.shape[1])), value=pad_id)
    refs = torch.nn.functional.pad(refs, (0, max(0, 1 - refs.shape[2])), value=pad_id)
    ref_len = torch.where(present, ref_len, 0)
    cand_len = cand_len.clamp(0, cand.shape[1])  # lengths beyond the tensor cannot be read
    ref_len = ref_len.clamp(0, refs.shape[2])
    log_precision = torch.zeros(cand.shape[0], dtype=dtype, device=cand.device)
    unigram_matches, grams = None, None
    for n, weight in enumerate(weights, start=1):
        grams, prev = _NGrams(cand_len, ref_len, cand.shape[1], refs.shape[2], n, grams), grams
        build_ids(grams, cand, refs, prev)
        matches = _clipped_counts(grams, cand.shape[0], refs.shape[1]).to(dtype)
        total = (cand_len - n + 1).clamp(min=1).to(dtype)  # NLTK: max(1, number of n-grams)
        if smoothing == "floor":
            zero_value = epsilon / total
        else:  # NLTK method0 puts the smallest float where a count is 0
            zero_value = torch.full_like(total, sys.float_info.min)
        log_precision += weight * torch.log(torch.where(matches > 0, matches / total, zero_value))
        unigram_matches = matches if unigram_matches is None else unigram_matches
    score = _brevity_penalty(cand_len, ref_len, present, dtype) * torch.exp(log_precision)
    return torch.where(unigram_matches > 0, score, torch.zeros_like(score))


def _levenshtein_dp(hyp: torch.Tensor, hyp_len: torch.Tensor, ref: torch.Tensor,
                    ref_len: torch.Tensor) -> torch.Tensor:
    """Any lengths: the DP one hypothesis position (one row) at a time over the whole batch.

    Row i from row i-1: T[j] = min(D[i-1][j] + 1, D[i-1][j-1] + cost), then the in-row
    insertions D[i][j] = min_k<=j (T[k] + j - k) = j + cummin(T - j): no loop over j.
    """
    batch, width = ref.shape
    columns = torch.arange(width + 1, device=hyp.device)
    row = columns.expand(batch, width + 1).clone()  # D[0][j] = j
    result = ref_len.clone()  # an empty hypothesis needs len(ref) insertions
    for i in range(1, hyp.shape[1] + 1):
        cost = (hyp[:, i - 1, None] != ref).long()  # [B, Lr]
        diag_or_up = torch.minimum(row[:, 1:] + 1, row[:, :-1] + cost)
        first = torch.full((batch, 1), i, dtype=row.dtype, device=row.device)
        candidates = torch.cat([first, diag_or_up], dim=1)
        row = columns + torch.cummin(candidates - columns, dim=1).values
        result = torch.where(hyp_len == i, row.gather(1, ref_len[:, None]).squeeze(1), result)
    return result


# Bit-parallel path: a pattern of up to 62 tokens is one int64 bit-vector per sample. 62, not 64,
# keeps (Eq & Pv) + Pv below 2**63, so no signed overflow.
PATTERN_BITS = 62
_PACK_MAGIC = 0x0102040810204080  # moves byte k's lowest bit to bit 56 + k


def _match_masks(pattern: torch.Tensor, pattern_len: torch.Tensor,
                 text: torch.Tensor) -> torch.Tensor:
    """[B, Lt] int64: bit i of [b, j] is set where pattern[b, i] == text[b, j] (i < length)."""
    # Positions past the pattern's length hold a value no text token has, so that the big
    # comparison below needs no validity mask of its own.
    sentinel = int(text.min()) - 1 if text.numel() else -1
    padded = torch.nn.functional.pad(pattern, (0, 64 - pattern.shape[1]), value=sentinel)
    valid = torch.arange(64, device=pattern.device) < pattern_len[:, None]
    padded = torch.where(valid, padded, sentinel)
    if text.numel() and -2 ** 31 < sentinel and int(text.max()) < 2 ** 31:
        text, padded = text.int(), padded.int()  # the big comparison reads half the bytes
    equal = text[:, :, None] == padded[:, None, :]  # [B, Lt, 64] bool
    if sys.byteorder != "little":
        shifts = torch.arange(64, device=pattern.device)
        return (equal.long() << shifts).sum(-1)
    # Pack 64 bools into one int64 without a reduction: each group of 8 bools (bytes 0/1) read
    # as an int64 and multiplied by the magic constant has the 8 bits in its top byte; the 8
    # bytes of a row, read back as one little-endian int64, are the 64-bit mask.
    # In place on the comparison's own buffer: fresh 16 MB temporaries cost more in page faults
    # than the arithmetic.
    words = equal.view(torch.uint8).view(torch.int64)  # [B, Lt, 8]
    packed = words.mul_(_PACK_MAGIC).bitwise_right_shift_(56).to(torch.uint8)  # keeps low byte
    return packed.view(torch.int64).squeeze(-1)


def _levenshtein_bits(pattern: torch.Tensor, pattern_len: torch.Tensor, text: torch.Tensor,
                      text_len: torch.Tensor) -> torch.Tensor:
    """Myers' bit-vector edit distance (Hyyrö's global variant) for patterns <= 62 tokens:
    one DP column per text token as ~20 int64 operations on [B] vectors."""
    peq = _match_masks(pattern, pattern_len, text)
    one = torch.ones_like(pattern_len)
    mask = (one << pattern_len) - 1
    high = one << (pattern_len - 1).clamp(min=0)
    pv, mv = mask.clone(), torch.zeros_like(mask)
    xv, xh, ph, mh, tmp = (torch.empty_like(mask) for _ in range(5))
    # The last pattern row's +1 / -1 steps per text column, summed over each text's own columns
    # after the loop (cheaper than masking the running score at every step).
    up = torch.zeros(text.shape, dtype=torch.bool, device=text.device)
    down = torch.zeros_like(up)
    # In-place ops on preallocated vectors: at B ~ 4096 the per-op overhead, not arithmetic,
    # is the cost. Bits above the pattern length never flow down (carries and shifts go up), so
    # only values that later feed an addition or a shift are masked.
    for j in range(text.shape[1]):
        eq = peq[:, j]
        torch.bitwise_or(eq, mv, out=xv)
        torch.bitwise_and(eq, pv, out=xh).add_(pv).bitwise_xor_(pv).bitwise_or_(eq)
        torch.bitwise_or(xh, pv, out=ph).bitwise_not_().bitwise_or_(mv).bitwise_and_(mask)
        torch.bitwise_and(pv, xh, out=mh)
        torch.ne(torch.bitwise_and(ph, high, out=tmp), 0, out=up[:, j])
        torch.ne(torch.bitwise_and(mh, high, out=tmp), 0, out=down[:, j])
        ph.bitwise_left_shift_(1).bitwise_or_(1)  # carry-in 1: top DP row is 0, 1, 2, ...
        mh.bitwise_left_shift_(1)
        torch.bitwise_or(xv, ph, out=pv).bitwise_not_().bitwise_or_(mh).bitwise_and_(mask)
        torch.bitwise_and(ph, xv, out=mv)
    inside = torch.arange(text.shape[1], device=text.device) < text_len[:, None]
    score = pattern_len + (up & inside).sum(1) - (down & inside).sum(1)
    return torch.where(pattern_len == 0, text_len, score)


def edit_distance(hypotheses: Tokens, references: Tokens, *,
                  hyp_lengths: torch.Tensor | None = None, ref_lengths: torch.Tensor | None = None,
                  pad_id: int = 0) -> torch.Tensor:
    """Levenshtein distance per pair [B] (unit costs), for the whole batch at once.

    Pairs whose shorter side has <= 62 tokens use bit-parallel vectors (the shorter side is the
    pattern: the distance is symmetric); the rest use a row-at-a-time DP.

    >>> edit_distance([[1, 2, 3], [7]], [[1, 3], [7, 8, 9]])
    tensor([1, 2])
    """
    hyp, hyp_len = pad_batch(hypotheses, hyp_lengths, pad_id)
    ref, ref_len = pad_batch(references, ref_lengths, pad_id, device=hyp.device)
    hyp_len, ref_len = hyp_len.clamp(0, hyp.shape[1]), ref_len.clamp(0, ref.shape[1])
    width = max(hyp.shape[1], ref.shape[1], 1)
    hyp = torch.nn.functional.pad(hyp, (0, width - hyp.shape[1]), value=pad_id)
    ref = torch.nn.functional.pad(ref, (0, width - ref.shape[1]), value=pad_id)
    swap = hyp_len < ref_len
    pattern, text = torch.where(swap[:, None], hyp, ref), torch.where(swap[:, None], ref, hyp)
    pattern_len = torch.where(swap, hyp_len, ref_len)
    text_len = torch.where(swap, ref_len, hyp_len)
    result = torch.empty_like(hyp_len)
    short = pattern_len <= PATTERN_BITS
    if bool(short.all()):
        rows = slice(None)  # the common case: no gather / scatter copies
    else:
        rows = short.nonzero().squeeze(1)
        long_rows = (~short).nonzero().squeeze(1)
        result[long_rows] = _levenshtein_dp(hyp[long_rows], hyp_len[long_rows], ref[long_rows],
                                            ref_len[long_rows])
    if text_len[rows].numel():
        text_width = int(text_len[rows].max())
        result[rows] = _levenshtein_bits(pattern[rows, :PATTERN_BITS], pattern_len[rows],
                                         text[rows, :text_width], text_len[rows])
    return result


def token_wer(hypotheses: Tokens, references: Tokens, *, hyp_lengths: torch.Tensor | None = None,
              ref_lengths: torch.Tensor | None = None, pad_id: int = 0) -> torch.Tensor:
    """WER per pair [B] float64: edits / reference length, as `jiwer.wer` on the same tokens
    (an empty reference gives the number of inserted tokens, as jiwer does).

    >>> token_wer([[1, 2, 3], [4]], [[1, 2, 4, 5], []])
    tensor([0.5000, 1.0000], dtype=torch.float64)
    """
    hyp, hyp_len = pad_batch(hypotheses, hyp_lengths, pad_id)
    ref, ref_len = pad_batch(references, ref_lengths, pad_id, device=hyp.device)
    distance = edit_distance(hyp, ref, hyp_lengths=hyp_len, ref_lengths=ref_len).double()
    return torch.where(ref_len > 0, distance / ref_len.clamp(min=1), hyp_len.double())
