"""Shared-prefix rollouts: each prompt (media encoder included) prefilled ONCE, its G samples
decoded from copies of that KV cache (optionally in rounds of g rows per prompt).

Split from shared_prefix.py (the training forward): the two share only the exact positions
(`prompt_and_completion_positions`) and nothing else.
"""
from __future__ import annotations

from typing import Sequence

import torch

from mmrl.models.forward import upcast
from mmrl.models.shared_prefix import _takes_logits_index, prompt_and_completion_positions
from mmrl.types import PromptFeatures, SamplingParams


# ----------------------------------------------------------------------------- sampling ---------

def _pad_left(rows: list[torch.Tensor], width: int, value) -> torch.Tensor:
    """Stack [..., n_i] tensors left-padded to `width` along the last dim."""
    return torch.stack([torch.cat([r.new_full((*r.shape[:-1], width - r.shape[-1]), value), r], -1)
                        for r in rows])


def _sample_rows(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling, one uniform in [0, 1) per row: the draw depends on that row's own
    uniform only, so a row's sample does not depend on which other rows share the batch (the
    property that makes rounds and prefill sharing give the same samples). Zero-probability
    tokens are never chosen: the threshold is > 0 and searchsorted finds the first cdf >= it."""
    probs = torch.softmax(scores.double(), dim=-1)
    cdf = probs.cumsum(-1)
    threshold = (1.0 - uniforms.double().to(scores.device))[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, threshold).squeeze(1).clamp(max=scores.shape[-1] - 1)


class _Prefill:
    """Prompts prefilled once (left-padded batch): KV cache, last-position logits, the 2-D mask,
    and each row's positions for the tokens it will generate."""

    def __init__(self, model, prompts: Sequence[PromptFeatures], max_new_tokens: int, pad_id: int):
        from mmrl.models.forward import collate

        device = next(model.parameters()).device
        inputs = collate(prompts, pad_id=pad_id)
        width = inputs["input_ids"].shape[1]
        positions, self.next_positions = [], []
        for p in prompts:
            pos = prompt_and_completion_positions(model, p, max_new_tokens)  # [R, P + L]
            plen = p.input_ids.shape[0]
            positions.append(pos[:, :plen])
            self.next_positions.append(pos[:, plen:])  # [R, L]
        position_ids = _pad_left(positions, width, 0)  # [B, R, P]
        inputs["position_ids"] = (position_ids.permute(1, 0, 2) if position_ids.shape[1] == 3
                                  else position_ids[:, 0])
        inputs = {k: v.to(device) for k, v in inputs.items()}
        kwargs = {"logits_to_keep": 1} if _takes_logits_index(model) else {}
        out = model(**inputs, use_cache=True, **kwargs)
        self.cache = out.past_key_values
        self.logits = upcast(out.logits[:, -1])  # [B, V]
        self.attention_mask = inputs["attention_mask"]
        self.next_positions = torch.stack(self.next_positions).to(device)  # [B, R, L]


def _decode(model, cache, logits, attention_mask, next_positions, uniforms, *, max_new_tokens,
            temperature, warpers, suppress, do_sample, eos, pad_id, session=None):
    """Sample up to max_new_tokens for every row of an (already expanded) prefill. Returns
    (tokens [n, steps], sampler logp [n, steps], cache bytes held, forwards run); rows stop at
    their first EOS (pad after). `session` (compiled_decode.DecodeSession): each token's forward
    runs there, on its static cache, instead of the model's eager forward on `cache`."""
    n = logits.shape[0]
    device = logits.device
    unfinished = torch.ones(n, dtype=torch.bool, device=device)
    tokens, logps = [], []
    forwards = 0
    for step in range(max_new_tokens):
        policy = torch.log_softmax(logits / temperature, dim=-1)
        scores = logits if suppress is None else logits.index_fill(-1, suppress, float("-inf"))
        if do_sample:
            for warper in warpers:
                scores = warper(None, scores)
            chosen = _sample_rows(scores, uniforms[:, step])
        else:
            chosen = scores.argmax(-1)
        chosen = torch.where(unfinished, chosen, torch.full_like(chosen, pad_id))
        tokens.append(chosen)
        logps.append(policy.gather(-1, chosen[:, None]).squeeze(-1))
        unfinished &= ~torch.isin(chosen, eos)
        if not unfinished.any() or step == max_new_tokens - 1:
            break
        pos = next_positions[:, :, step:step + 1]  # [n, R, 1]
        pos = pos.permute(1, 0, 2) if pos.shape[1] == 3 else pos[:, 0]
        forwards += 1
        if session is not None:
            logits = session(chosen, pos, step)
            continue
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(n, 1)], 1)
        out = model(input_ids=chosen[:, None], attention_mask=attention_mask, position_ids=pos,
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = upcast(out.logits[:, -1])
    held = session.cache_bytes() if session is not None else cache_bytes(cache)
    return torch.stack(tokens, 1), torch.stack(logps, 1), held, forwards


def cache_bytes(cache) -> int:
    """Bytes held by a KV cache's key/value tensors."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if torch.is_tensor(t):
                total += t.numel() * t.element_size()
    return total


@torch.no_grad()
def generate_shared(model, processor, prompts: Sequence[PromptFeatures],
                    sampling: SamplingParams = SamplingParams(), *, rounds_of: int | None = None,
                    prefill: str = "shared", stats: dict | None = None, decoder=None):
    """`forward.generate`'s contract (group-major rows, sampler logp before truncation and
    suppression, mask up to and including the first EOS) with each prompt prefilled ONCE, media
    encoder included, and its G samples decoded from copies of that cache.

    `rounds_of=g`: sample the G completions of every prompt in rounds of g rows per prompt
    (Infinite-Sampling style), bounding the KV cache to B*g rows instead of B*G.
    `prefill="per_row"`: the unshared reference (prompt and media repeated G times, G prefills).
    `stats`: if a dict, receives `prefill_rows` (rows run through the prompt + media forward),
    `peak_cache_bytes` (largest KV-cache footprint held at once, prefill copy included) and the
    timing `decode_timing` reads (`prefill_s`, `decode_s`, `decode_forwards`, `kv_read_bytes`).
    `decoder` (compiled_decode.CompiledDecoder): every token after the prefill runs its compiled
    static-cache step; the prefill and the sampling are the same code either way.

    Sampling is inverse-CDF with one uniform per (row, step) drawn up front from `seed`, so a
    row's sample depends only on the seed, its row index and its own logits: the same samples
    for any `rounds_of` and either prefill, to float error in the logits. (HF's generate draws
    one multinomial over all rows per step instead, so its samples differ for the same seed.)
    """
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from mmrl.models.forward import Generation, _eos_ids, completion_mask_from_eos

    if prefill not in ("shared", "per_row"):
        raise ValueError(f"prefill must be 'shared' or 'per_row', not {prefill!r}")
    num_generations, max_new_tokens, temperature, top_p, top_k, do_sample = (
        sampling.num_generations, sampling.max_new_tokens, sampling.temperature, sampling.top_p,
        sampling.top_k, sampling.do_sample)
    suppress_ids, seed, eos_ids = sampling.suppress_ids, sampling.seed, sampling.eos_ids
    tokenizer = getattr(processor, "tokenizer", processor)
    pad_id = tokenizer.pad_token_id
    eos_ids = list(eos_ids) if eos_ids is not None else _eos_ids(model, processor)
    device = next(model.parameters()).device
    n_groups, g_total = len(prompts), num_generations
    n = n_groups * g_total
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    # Drawn for all rows at once (row-major) whatever the rounds: row i's stream is U[i].
    uniforms = torch.rand((n, max_new_tokens), generator=generator, dtype=torch.float64)
    warpers = [TemperatureLogitsWarper(temperature)] if do_sample and temperature != 1.0 else []
    if do_sample and top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if do_sample and top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, warpers=warpers,
                  suppress=torch.as_tensor(list(suppress_ids), device=device) if suppress_ids else None,
                  do_sample=do_sample, eos=torch.as_tensor(eos_ids, device=device), pad_id=pad_id)
    step = g_total if not rounds_of or rounds_of >= g_total else rounds_of
    clock = _Clock(device)
    base = None
    if prefill == "shared":
        base = _Prefill(model, prompts, max_new_tokens, pad_id)
    clock.lap("prefill_s")
    pieces = []  # (output rows, tokens, logps)
    peak = 0
    for start in range(0, g_total, step):
        g = min(step, g_total - start)
        rows = torch.tensor([b * g_total + start + j for b in range(n_groups) for j in range(g)])
        if base is not None:
            pre, repeats = base, g
        else:
            pre = _Prefill(model, [prompts[b] for b in range(n_groups) for _ in range(g)],
                           max_new_tokens, pad_id)
            repeats = 1
            clock.lap("prefill_s")
        width = pre.attention_mask.shape[1]
        if decoder is not None:
            cache = None
            session = decoder.session(pre.cache, pre.attention_mask, repeats, max_new_tokens)
        else:
            cache = _copy_cache(pre.cache, repeats) if base is not None else pre.cache
            session = None
        state = (pre.logits.repeat_interleave(repeats, 0),
                 pre.attention_mask.repeat_interleave(repeats, 0),
                 pre.next_positions.repeat_interleave(repeats, 0))
        tokens, logps, held, forwards = _decode(model, cache, *state, uniforms[rows],
                                                session=session, **common)
        del cache, session
        clock.lap("decode_s")
        clock.add("decode_forwards", forwards)
        # What each decode forward reads from the cache: its rows' keys and values up to the
        # token it writes (the prompt's width plus the tokens before it).
        clock.add("kv_read_bytes", _kv_bytes_per_token(pre.cache) * len(rows)
                  * (forwards * width + forwards * (forwards + 1) // 2))
        peak = max(peak, held + (cache_bytes(base.cache) if base is not None else 0))
        pieces.append((rows, tokens, logps))
    width = max(t.shape[1] for _, t, _ in pieces)
    completion = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    sampler_logp = torch.zeros((n, width), dtype=pieces[0][2].dtype, device=device)
    for rows, tokens, logps in pieces:
        completion[rows.to(device), :tokens.shape[1]] = tokens
        sampler_logp[rows.to(device), :logps.shape[1]] = logps
    if stats is not None:
        stats["prefill_rows"] = n_groups if base is not None else n
        stats["peak_cache_bytes"] = peak
        stats.update(clock.totals)
    mask, truncated = completion_mask_from_eos(completion, eos_ids)
    completion = torch.where(mask.bool(), completion, torch.full_like(completion, pad_id))
    return Generation(completion, mask, sampler_logp * mask, truncated)


def _kv_bytes_per_token(cache) -> int:
    """Bytes of keys and values one token of one row holds in `cache`, over all layers."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if torch.is_tensor(t) and t.shape[0] and t.shape[-2]:
                total += t[0, :, 0].numel() * t.element_size()
    return total


class _Clock:
    """Seconds between laps (synchronising the device first, so a lap holds its own kernels)
    and counts, summed by name."""

    def __init__(self, device):
        import time

        self.device, self.now, self.cpu, self.totals = device, time.perf_counter, time.process_time, {}
        self.last, self.last_cpu = self.now(), self.cpu()

    def lap(self, name: str) -> None:
        """Add the seconds since the last lap to `name` and its CPU seconds (this process, all
        threads: less sensitive to other jobs on a shared machine) to `name` with _cpu_s."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t, c = self.now(), self.cpu()
        self.add(name, t - self.last)
        self.add(name.replace("_s", "_cpu_s"), c - self.last_cpu)
        self.last, self.last_cpu = t, c

    def add(self, name: str, value) -> None:
        self.totals[name] = self.totals.get(name, 0) + value


def _copy_cache(cache, repeats: int):
    """A copy of a prefilled KV cache with every row repeated `repeats` times (group-major);
    the prefilled cache itself is left intact for the next round."""
    import copy

    out = copy.deepcopy(cache)
    out.batch_repeat_interleave(repeats)
    return out
