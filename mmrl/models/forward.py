"""Family-agnostic model calls: batch building, completion log-probabilities, HF sampling.

One layout serves generation and training: prompts LEFT-padded to a common length, completions
appended right-padded. generate() needs left padding; using the same layout for the training
forward makes its log-probabilities equal the generation-time ones (to float error), which a
unit test checks for every family.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import torch

from mmrl.models.base import TOKEN_KEYS
from mmrl.models.trajectory import completion_token_types, row_media
from mmrl.types import Observation, PromptFeatures, SamplingParams


def collate(prompts: Sequence[PromptFeatures], completion_ids: torch.Tensor | None = None,
            completion_mask: torch.Tensor | None = None, pad_id: int = 0,
            observations: Sequence[Sequence[Observation]] | None = None) -> dict:
    """Model inputs for N rows (prompt i -> row i), ready for `model(**inputs)`.

    input_ids/attention_mask/mm_token_type_ids: [N, P + L], prompts left-padded to P = the
    longest prompt, completions (if given) appended; attention is 0 on left pads and where
    `completion_mask` is 0. Media tensors: each row's own, concatenated along dim 0 in row order
    (a PromptFeatures shared by G rows contributes its media G times). With completions the dict
    also holds `logits_to_keep = L + 1`, so the LM head only runs over the positions that
    predict completion tokens (logits[:, :-1] predict completion tokens 0..L-1).

    `observations` (tool-use trajectories): per row, the observation turns inside its completion;
    their tokens keep their media types and each row's media follow its prompt's, in order, so
    the model computes every position over the whole row (mmrl/models/trajectory.py).
    """
    if completion_ids is not None and completion_ids.shape[0] != len(prompts):
        raise ValueError(f"collate: {len(prompts)} prompts but {completion_ids.shape[0]} completion rows")
    if observations is not None and len(observations) != len(prompts):
        raise ValueError(f"collate: {len(prompts)} prompts but {len(observations)} observation rows")
    width = max(p.tensors["input_ids"].shape[1] for p in prompts)
    # mm_token_type_ids is carried iff the family's prompts hold it: M-RoPE families need it in
    # every forward; families without it (Qwen2-Audio, Qwen2.5-Omni) reject it in generate().
    with_types = ["mm_token_type_ids" in p.tensors for p in prompts]
    if any(with_types) and not all(with_types):
        raise ValueError("collate: some prompts carry mm_token_type_ids and some do not (mixed families?)")
    keys = TOKEN_KEYS if all(with_types) else tuple(k for k in TOKEN_KEYS if k != "mm_token_type_ids")
    token_rows: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for p in prompts:
        ids = p.tensors["input_ids"][0]
        pad = width - ids.shape[0]
        attn = p.tensors.get("attention_mask", torch.ones_like(ids[None]))[0]
        token_rows["input_ids"].append(torch.cat([ids.new_full((pad,), pad_id), ids]))
        token_rows["attention_mask"].append(torch.cat([attn.new_zeros(pad), attn]))
        if "mm_token_type_ids" in token_rows:
            types = p.tensors["mm_token_type_ids"][0]
            token_rows["mm_token_type_ids"].append(torch.cat([types.new_zeros(pad), types]))
    out = {k: torch.stack(v) for k, v in token_rows.items()}
    if completion_ids is not None:
        if completion_mask is None:
            completion_mask = torch.ones_like(completion_ids)
        mask = completion_mask.to(out["attention_mask"].dtype)
        # Tokens under mask 0 are never attended to, but the model still counts placeholder ids
        # anywhere in input_ids against the media features: blank them to pad.
        ids = torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids, pad_id))
        out["input_ids"] = torch.cat([out["input_ids"], ids.to(out["input_ids"].dtype)], 1)
        out["attention_mask"] = torch.cat([out["attention_mask"], mask], 1)
        if "mm_token_type_ids" in out:
            width = ids.shape[1]
            types = (torch.stack([completion_token_types(o, width) for o in observations])
                     if observations is not None else ids.new_zeros(ids.shape))
            out["mm_token_type_ids"] = torch.cat([out["mm_token_type_ids"], types.to(
                out["mm_token_type_ids"].dtype)], 1)
        out["logits_to_keep"] = completion_ids.shape[1] + 1
    rows = [row_media(p.tensors, observations[i] if observations is not None else None)
            for i, p in enumerate(prompts)]
    for key in dict.fromkeys(k for r in rows for k in r):
        out[key] = torch.cat([r[key] for r in rows if key in r], 0)
    return out


def _to_device(inputs: dict, device: torch.device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}


def check_no_placeholders(completion_ids: torch.Tensor, completion_mask: torch.Tensor | None,
                          placeholder_ids: Sequence[int]) -> None:
    """ValueError naming the first row whose (unmasked) completion holds a media placeholder id:
    fed back to the model it would fail deep inside ("features and tokens do not match")."""
    if not placeholder_ids:
        return
    bad = torch.isin(completion_ids, torch.as_tensor(list(placeholder_ids), device=completion_ids.device))
    if completion_mask is not None:
        bad &= completion_mask.bool()
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"completion row {row} holds media placeholder token id {int(completion_ids[row, col])} "
            f"at position {col}; placeholders must be suppressed at sampling time")


def upcast(logits: torch.Tensor) -> torch.Tensor:
    """Logits in the dtype log-probs are computed in: float32 for bf16/fp16/fp32, float64 kept (a
    float64 model is how the tests tell rounding from a real sampler/trainer mismatch)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def completion_logprobs(model, inputs: dict, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor | None = None, *, temperature: float = 1.0,
                        return_entropy: bool = False, placeholder_ids: Sequence[int] = ()):
    """Per-token log p(completion token | prefix) under `model` at `temperature`: [N, L] float32,
    float64 for a float64 model (and the entropy of each predictive distribution, [N, L], if
    `return_entropy`).

    `inputs` is `collate(prompts, completion_ids, completion_mask, pad_id)`. Values where the
    mask is 0 are meaningless (not zeroed); losses must mask them. Differentiable.
    """
    check_no_placeholders(completion_ids, completion_mask, placeholder_ids)
    length = completion_ids.shape[1]
    inputs = dict(inputs, logits_to_keep=length + 1, use_cache=False)
    device = next(model.parameters()).device
    # The last L+1 positions predict the completion tokens: a model that ignores `logits_to_keep`
    # (Qwen2-Audio's forward in transformers 5.19) returns all P+L, the rest return exactly L+1.
    logits = model(**_to_device(inputs, device)).logits[:, -(length + 1):-1]  # [N, L, V]
    targets = completion_ids.to(device)
    logps, entropies = [], []
    # Row by row: the float32 copy of one row's logits is small; all rows at once can be GBs.
    for row_logits, row_targets in zip(logits, targets):
        scaled = upcast(row_logits) / temperature
        lse = torch.logsumexp(scaled, dim=-1)
        logps.append(scaled.gather(-1, row_targets[:, None]).squeeze(-1) - lse)
        if return_entropy:
            probs = torch.softmax(scaled, dim=-1)
            entropies.append(lse - (probs * scaled).sum(-1))
    logp = torch.stack(logps)
    return (logp, torch.stack(entropies)) if return_entropy else logp


class Generation(NamedTuple):
    completion_ids: torch.Tensor  # [N, L] pad after the first EOS
    completion_mask: torch.Tensor  # [N, L] 1 up to and including the first EOS
    sampler_logp: torch.Tensor  # [N, L] float32 (float64 model: float64), 0 where the mask is 0
    truncated: torch.Tensor  # [N] bool: no EOS within max_new_tokens


class _PolicyLogprobs:
    """Logits processor that records log p(chosen token) under softmax(raw logits / T) and then
    masks the suppressed ids.

    Why not HF's `suppress_tokens` + `output_scores`: HF applies suppress_tokens before custom
    processors, and `scores` hold one [N, V] tensor per step (GBs for real vocabularies). This
    keeps one step of log-probs; the token chosen at step t is read at step t+1 (last column of
    input_ids) and the final step's after generate() returns.
    """

    def __init__(self, temperature: float, suppress_ids: Sequence[int]):
        self.temperature = temperature
        self.suppress_ids = list(suppress_ids)
        self.pending: torch.Tensor | None = None  # [N, V] log-probs of the last step
        self.steps: list[torch.Tensor] = []
        self.first_call: float | None = None  # clock and CPU clock at the prefill's logits
        self.first_cpu: float | None = None

    def _flush(self, chosen: torch.Tensor) -> None:
        self.steps.append(self.pending.gather(-1, chosen[:, None]).squeeze(-1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.first_call is None:  # the prefill's logits: what came before was the prefill
            _sync(scores.device)
            self.first_call, self.first_cpu = time.perf_counter(), time.process_time()
        if self.pending is not None:
            self._flush(input_ids[:, -1])
        self.pending = torch.log_softmax(upcast(scores) / self.temperature, dim=-1)
        if self.suppress_ids:
            scores = scores.index_fill(-1, torch.as_tensor(self.suppress_ids, device=scores.device),
                                       float("-inf"))
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._flush(last_tokens)
        return torch.stack(self.steps, dim=1)


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels, so a clock read after it holds them (CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token of one row holds in the KV cache, all layers, from the
    text config's widths (a KV head's width: head_dim, else hidden_size / heads)."""
    cfg = model.config.get_text_config()
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    element = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * element


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: Sequence[int]):
    """(mask [N, L]: 1 up to and including the first EOS, truncated [N]: no EOS at all)."""
    is_eos = torch.isin(completion_ids, torch.as_tensor(list(eos_ids), device=completion_ids.device))
    truncated = ~is_eos.any(1)
    # Index of the first EOS, or L when there is none.
    first = torch.where(truncated, completion_ids.shape[1], is_eos.int().argmax(1))
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    return (positions[None] <= first[:, None]).long(), truncated


def _eos_ids(model, processor) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(processor, "tokenizer", processor).eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


@torch.no_grad()
def generate(model, processor, prompts: Sequence[PromptFeatures],
             sampling: SamplingParams = SamplingParams(), stats: dict | None = None) -> Generation:
    """Sample `sampling.num_generations` completions per prompt with HF generate.

    Rows are group-major: rows g*G .. g*G+G-1 belong to prompts[g]. `sampler_logp` is the
    log-prob of each sampled token under softmax(logits / temperature) of the unmodified model:
    BEFORE top-p/top-k truncation and placeholder suppression, i.e. exactly what
    `completion_logprobs` computes (so it can serve as PPO's old log-probs when the policy did
    not change). `seed` makes sampling reproducible without touching the global RNG stream.
    `stats`: if a dict, receives `prefill_s` (until the first logits), `decode_s` (the rest),
    `decode_forwards` and `kv_read_bytes` (keys and values the decode forwards read).
    """
    from transformers import GenerationConfig, LogitsProcessorList

    s = sampling
    num_generations, temperature, do_sample, seed = (s.num_generations, s.temperature,
                                                     s.do_sample, s.seed)
    tokenizer = getattr(processor, "tokenizer", processor)
    pad_id = tokenizer.pad_token_id
    eos_ids = list(s.eos_ids) if s.eos_ids is not None else _eos_ids(model, processor)
    per_row = num_generations > 1 and not _hf_expands_media(model, prompts)
    rows = [p for p in prompts for _ in range(num_generations)] if per_row else list(prompts)
    inputs = _to_device(collate(rows, pad_id=pad_id), next(model.parameters()).device)
    recorder = _PolicyLogprobs(temperature, s.suppress_ids)
    config = GenerationConfig(
        do_sample=do_sample, temperature=temperature if do_sample else None,
        top_p=s.top_p if do_sample else None, top_k=s.top_k if do_sample else None,
        max_new_tokens=s.max_new_tokens, num_return_sequences=1 if per_row else num_generations,
        eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=None, use_cache=True)
    # The model's own generation_config (e.g. a checkpoint's repetition_penalty or top_k) would
    # fill every field left unset here and warp the logits: swap in a neutral one for the call.
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id)
    try:
        # Without a seed, sampling must advance the global stream (two calls, two samples).
        with torch.random.fork_rng(devices=_rng_devices(model), enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            start, start_cpu = time.perf_counter(), time.process_time()
            sequences = model.generate(**inputs, generation_config=config,
                                       logits_processor=LogitsProcessorList([recorder]))
            _sync(sequences.device)
            end, end_cpu = time.perf_counter(), time.process_time()
    finally:
        model.generation_config = saved
    completion = sequences[:, inputs["input_ids"].shape[1]:]
    if stats is not None:
        first, first_cpu = recorder.first_call or end, recorder.first_cpu or end_cpu
        width, forwards = inputs["input_ids"].shape[1], completion.shape[1] - 1
        stats.update(prefill_s=first - start, decode_s=end - first, decode_forwards=forwards,
                     prefill_cpu_s=first_cpu - start_cpu, decode_cpu_s=end_cpu - first_cpu,
                     kv_read_bytes=kv_bytes_per_token(model) * sequences.shape[0]
                     * (forwards * width + forwards * (forwards + 1) // 2))
    sampler_logp = recorder.finish(completion[:, -1])
    mask, truncated = completion_mask_from_eos(completion, eos_ids)
    completion = torch.where(mask.bool(), completion, torch.full_like(completion, pad_id))
    return Generation(completion, mask, sampler_logp * mask, truncated)


# Media that HF generate() encodes once per prompt and expands correctly for
# num_return_sequences (`mm_encoder_outputs`); the grids only feed 3-D positions, which it also
# computes before expanding.
_PRE_ENCODED_KEYS = frozenset({"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                               "second_per_grid_ts", "video_second_per_grid"})


def _hf_expands_media(model, prompts: Sequence[PromptFeatures]) -> bool:
    """Whether `num_return_sequences` gives each sample row its own prompt's media.

    HF repeat_interleaves every other model kwarg along dim 0, which is right only when that
    tensor has one row per prompt: audio features [n_audios, ...] of a two-audio prompt would
    be handed to the wrong rows. Otherwise generate() repeats the prompts itself (the encoders
    then run G times, as they do in the training forward).
    """
    supports = getattr(model, "_supports_mm_encoder_outputs", None)
    if supports is None or not supports():
        keys = {k for p in prompts for k in p.tensors if k not in TOKEN_KEYS}
        return not keys
    return all(k in TOKEN_KEYS or k in _PRE_ENCODED_KEYS for p in prompts for k in p.tensors)


def _rng_devices(model) -> list[int]:
    device = next(model.parameters()).device
    return [device.index or 0] if device.type == "cuda" else []
