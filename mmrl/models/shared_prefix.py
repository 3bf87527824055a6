"""Shared-prefix training forward: each prompt (media encoder included) computed once per group.

In GRPO a prompt is answered G times. The naive layout (`forward.collate`) runs G rows of
[prompt, completion], i.e. the vision/audio encoder and every prompt token G times: G*(P+C)
tokens where P + G*C suffice. Here each group becomes ONE packed row

    [prompt | c1[:-1] | c2[:-1] | ... | cG[:-1] | right pad]

with a 4-D boolean attention mask (the prompt is causal; every completion sees the whole
prompt and its own causal past, never another completion) and explicit position ids: the
completion tokens get exactly the positions the naive layout gives them (M-RoPE: computed by the
model's own `get_rope_index` on [prompt, completion], so no rule like "max + 1" is assumed).

Why a completion's LAST token is left out: its hidden state predicts nothing (the logprob of
token k comes from the hidden state at token k-1, token 0's from the prompt's last position).

Why this layout rather than a prompt pass whose KV cache the completions attend to: the packed
row is one ordinary forward, so it works under gradient checkpointing, DDP/FSDP wrappers and
any attention that takes a 4-D mask (sdpa, eager). flash-attention takes no mask: there the
same layout runs on the varlen kernel of prefix_attention.py (`enable_shared_prefix` switches
flash_attention_2 to it), with every group of a micro-batch in one pad-free row.
Rollouts that prefill each prompt once live in shared_generate.py.

Rows are grouped by PromptFeatures identity (rows of one group share one object), so any row
subset works: a micro-batch that cuts a group computes that group's prompt once for its rows.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from mmrl.models.base import TOKEN_KEYS
from mmrl.models import prefix_attention
from mmrl.models.forward import check_no_placeholders, upcast
from mmrl.models.trajectory import completion_token_types, policy_token_mask, row_media
from mmrl.types import Observation, PromptFeatures

# The attention implementations that take the layout's 4-D group mask, each with the mask's form:
# sdpa takes it boolean, eager adds it to the scores.
MASKED_ATTENTION = {"sdpa": lambda mask, dtype: mask,
                    "eager": lambda mask, dtype: _additive(mask, dtype)}
# Implementations the layout swaps for its varlen kernel (same kernel family, packed groups).
_VARLEN_FOR = {"flash_attention_2": prefix_attention.NAME}
# Names of the Ulysses sequence-parallel kernels: this prefix + the kernel they wrap.
SP_PREFIX = "mmrl_ulysses_"


def unwrap(model):
    """The transformers model inside DDP / FSDP / torch.compile / peft wrappers (for config,
    signatures and `get_rope_index` only: the forward itself always goes through the wrapper)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None and hasattr(model, "get_base_model"):  # peft
            inner = model.get_base_model()
        if inner is None or inner is model:
            return model
        model = inner


def attn_implementation(model) -> str:
    """The text decoder's attention kernel (under sequence parallelism: the kernel Ulysses
    runs on the whole sequence, models/ulysses.py)."""
    config = unwrap(model).config
    text = getattr(config, "text_config", None) or config
    name = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", "eager")
    return name.removeprefix(SP_PREFIX)


def supports_shared_prefix(model) -> bool:
    """True when the model's attention takes a custom 4-D mask (sdpa, eager) or is the
    shared-prefix varlen kernel (prefix_attention.NAME)."""
    return attn_implementation(model) in MASKED_ATTENTION or uses_varlen(model)


def uses_varlen(model) -> bool:
    return attn_implementation(model) == prefix_attention.NAME


def enable_shared_prefix(model, wanted: bool = True) -> tuple[bool, str]:
    """Decide (once, at start) whether training forwards use the shared-prefix layout, switching
    flash_attention_2 to the varlen path (flash_attn_varlen_func for the layout, flash_attention_2
    for every other call: nothing else changes). -> (on, one line saying why, for the log)."""
    impl = attn_implementation(model)
    if not wanted:
        return False, "shared-prefix layout off (train.shared_prefix=false): prompts run G times"
    if impl in _VARLEN_FOR:
        impl = _VARLEN_FOR[impl]
        unwrap(model).set_attn_implementation(impl)
    if impl == prefix_attention.NAME:
        return True, (f"shared-prefix layout on: varlen attention ({prefix_attention.kernel_description()}), "
                      f"groups packed pad-free")
    if impl in MASKED_ATTENTION:
        return True, (f"shared-prefix layout on: {impl} with a 4-D group mask (a group packs in "
                      f"runs of the size with the fewest FLOPs: long completions, smaller runs)")
    return False, (f"shared-prefix layout OFF: attn_implementation={impl!r} cannot take it, so every "
                   f"prompt runs G times; set model.attn_implementation to flash_attention_2 (GPU), "
                   f"{prefix_attention.NAME}, sdpa or eager")


def group_rows(prompts: Sequence[PromptFeatures]) -> list[list[int]]:
    """Row indices grouped by PromptFeatures identity, groups in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(id(p), []).append(i)
    return list(groups.values())


# ----------------------------------------------------------------------------- pack sizes -------
# A dense 4-D mask makes every packed row's attention (P + g*C)^2, however few of those scores
# it allows. Where completions are long beside the prompt (tool-use trajectories: observations
# in the completion; long reasoning) a whole group in one row attends over more than its G
# naive rows would: G (P + C)^2. So under a dense mask a group packs into runs of the size g
# whose FLOPs are fewest; the varlen kernel's attention is P^2 + G*C*(P + C): whole groups.

def layer_flops(model) -> tuple[int, int]:
    """(FLOPs a token costs in one decoder layer's linear maps, FLOPs one attention score costs
    there: QK^T and AV) from the text config."""
    text = unwrap(model).config.get_text_config()
    hidden, heads = text.hidden_size, text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    ffn = getattr(text, "intermediate_size", None) or 4 * hidden
    linear = 2 * (2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * ffn)
    return linear, 4 * heads * head_dim


def pack_size(prompt_len: int, lengths: Sequence[int], flops: tuple[int, int]) -> int:
    """How many of a group's completions (`lengths`, in row order) share one packed row under a
    dense mask: the run size with the fewest FLOPs (`flops` = layer_flops), the larger on a tie.
    1 is the naive layout; len(lengths) the whole group."""
    linear, score = flops

    def cost(g: int) -> int:
        tokens = [prompt_len + sum(lengths[s:s + g]) for s in range(0, len(lengths), g)]
        return sum(t * linear + t * t * score for t in tokens)
    return min(range(len(lengths), 0, -1), key=cost)


def split_groups(model, prompts: Sequence[PromptFeatures],
                 completion_mask: torch.Tensor) -> list[PromptFeatures]:
    """`prompts` with each group cut into runs of `pack_size` rows under a dense mask: each run
    after the first shares a shallow copy of the group's PromptFeatures (the same tensors), so
    `group_rows` sees one group per run. Unchanged under the varlen kernel."""
    out = list(prompts)
    if uses_varlen(model):
        return out
    flops, lengths = layer_flops(model), completion_mask.long().sum(1).tolist()
    for rows in group_rows(prompts):
        plen = prompts[rows[0]].tensors["input_ids"].shape[1]
        g = pack_size(plen, [max(lengths[i] - 1, 0) for i in rows], flops)
        for start in range(g, len(rows), g):
            run = dataclasses.replace(prompts[rows[0]])
            for i in rows[start:start + g]:
                out[i] = run
    return out


def completion_lengths(completion_mask: torch.Tensor) -> torch.Tensor:
    """[N] lengths; the mask must be a prefix of ones per row (what generation produces)."""
    lengths = completion_mask.long().sum(1)
    prefix = torch.arange(completion_mask.shape[1], device=completion_mask.device)[None] < lengths[:, None]
    if not torch.equal(prefix, completion_mask.bool()):
        row = int((prefix != completion_mask.bool()).any(1).nonzero()[0])
        raise ValueError(f"completion_mask row {row} is not a prefix of ones; the shared-prefix "
                         f"layout needs right-padded completions")
    return lengths


# ----------------------------------------------------------------------------- positions --------

def _rope_index_fn(model):
    """`get_rope_index` of an M-RoPE family (Qwen2-VL, Qwen2.5-VL, ...), else None (1-D RoPE)."""
    core = unwrap(model)
    owner = getattr(core, "model", None)
    if owner is not None and hasattr(owner, "get_rope_index"):
        return owner.get_rope_index
    for module in core.modules():  # any other nesting
        if hasattr(module, "get_rope_index"):
            return module.get_rope_index
    return None


def prompt_and_completion_positions(model, prompt: PromptFeatures, length: int,
                                    completion_ids: torch.Tensor | None = None,
                                    observations: Sequence[Observation] | None = None) -> torch.Tensor:
    """Position ids [R, P + length] of [prompt, `length` completion tokens] exactly as the naive
    layout gives them (R = 3 for M-RoPE, 1 for 1-D RoPE), from the family's own
    `get_rope_index` over the whole row. Without `observations` the completion is text (type 0)
    and its positions do not depend on its values: dummy ids stand in for `completion_ids`. A
    tool-use row passes its ids and observations: their media sit in the completion, after which
    text restarts at the media block's largest position + 1, so no turn-by-turn rule is assumed."""
    ids = prompt.tensors["input_ids"]
    attn = prompt.tensors.get("attention_mask", torch.ones_like(ids))
    tail = ids.new_zeros(1, length)
    if observations:
        tail = completion_ids[:length].to(ids)[None]
    full = {**prompt.tensors, **row_media(prompt.tensors, observations),
            "input_ids": torch.cat([ids, tail], 1),
            "attention_mask": torch.cat([attn, attn.new_ones(1, length)], 1)}
    if "mm_token_type_ids" in prompt.tensors:
        types = prompt.tensors["mm_token_type_ids"]
        full["mm_token_type_ids"] = torch.cat(
            [types, completion_token_types(observations, length).to(types)[None]], 1)
    positions = rope_positions(model, full)
    return positions[:, 0] if positions.ndim == 3 else positions


def rope_positions(model, tensors: dict) -> torch.Tensor:
    """Position ids of the rows in `tensors` (input_ids [B, T], attention_mask, media tensors)
    as the model's forward computes them: [3, B, T] from its `get_rope_index` (M-RoPE), or
    arange over each row [B, T] (1-D RoPE: relative, so a left pad shifts nothing)."""
    ids = tensors["input_ids"]
    fn = _rope_index_fn(model)
    if fn is None:
        return torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    accepted = inspect.signature(fn).parameters
    media = {k: v for k, v in tensors.items() if k not in TOKEN_KEYS and k in accepted}
    if "mm_token_type_ids" in accepted:  # Qwen2-VL / 2.5-VL / 3-VL
        media["mm_token_type_ids"] = tensors["mm_token_type_ids"]
    if "audio_seqlens" in accepted and "feature_attention_mask" in tensors:
        # Qwen2.5-Omni names its inputs differently: as its own forward passes them.
        media["audio_seqlens"] = tensors["feature_attention_mask"].sum(-1)
    if "second_per_grids" in accepted and "video_second_per_grid" in tensors:
        media["second_per_grids"] = tensors["video_second_per_grid"]
    positions, _ = fn(ids, attention_mask=tensors.get("attention_mask"), **media)
    return positions


# ----------------------------------------------------------------------------- packing ----------

@dataclass
class Packed:
    """Model inputs for the packed rows plus where each output row's logits come from."""

    inputs: dict  # input_ids [B, T], attention_mask [B, 1, T, T] bool, position_ids, media ...
    keep: torch.Tensor  # [K] sorted sequence positions whose logits are computed
    row_of: list[int]  # output row -> packed row b
    sources: list[torch.Tensor]  # output row -> [len_i] indices into `keep`
    lengths: list[int]  # output row -> completion length
    pad_fraction: float = 0.0  # pad tokens / all tokens of the packed rows


def pack_groups(model, prompts: Sequence[PromptFeatures], completion_ids: torch.Tensor,
                completion_mask: torch.Tensor, pad_id: int = 0, varlen: bool = False,
                observations: Sequence[Sequence[Observation]] | None = None) -> Packed:
    """One packed row per group of rows sharing a PromptFeatures (see the module docstring).
    `varlen`: every group in ONE row with no padding, and as attention mask the [1, 1, 1, T]
    segment ids that prefix_attention's varlen kernel reads (group * SEGMENT_BASE + j).
    `observations` (tool-use rows): each row's positions come from its own whole row, its
    observation media follow the group's prompt media, and its tokens keep their media types."""
    n = len(prompts)
    if completion_ids.shape[0] != n:
        raise ValueError(f"pack_groups: {n} prompts but {completion_ids.shape[0]} completion rows")
    lengths = completion_lengths(completion_mask).tolist()
    groups = group_rows(prompts)
    ids_rows, pos_rows, seg_rows, type_rows, valid_rows = [], [], [], [], []
    row_of, src_pos = [0] * n, [None] * n
    for b, rows in enumerate(groups):
        prompt = prompts[rows[0]]
        p_ids = prompt.tensors["input_ids"][0]
        plen = p_ids.shape[0]
        p_valid = prompt.tensors.get("attention_mask", torch.ones_like(p_ids[None]))[0].bool()
        longest = max(lengths[i] for i in rows)
        positions = prompt_and_completion_positions(model, prompt, longest)  # [R, P + longest]
        ids, pos, types = [p_ids], [positions[:, :plen]], []
        gid = b * prefix_attention.SEGMENT_BASE if varlen else 0
        seg = [torch.full((plen,), gid, dtype=torch.long)]
        valid = [p_valid]
        base = sum(r.shape[0] for r in ids_rows) if varlen else 0  # where this group starts
        if varlen:
            b = 0  # one row holds every group
        if varlen and not bool(p_valid.all()):
            raise ValueError("pack_groups(varlen=True): prompts must not be padded")
        offset = plen
        for j, i in enumerate(rows):
            # Tokens 0..len-2 of completion i: token len-1's hidden state predicts nothing.
            k = max(lengths[i] - 1, 0)
            ids.append(completion_ids[i, :k].to(p_ids.dtype))
            row_obs = None if observations is None else observations[i]
            row_pos = positions if not row_obs else prompt_and_completion_positions(
                model, prompt, lengths[i], completion_ids[i], row_obs)  # media in the completion
            pos.append(row_pos[:, plen:plen + k])
            types.append(completion_token_types(row_obs, lengths[i])[:k])
            seg.append(torch.full((k,), gid + j + 1, dtype=torch.long))
            valid.append(torch.ones(k, dtype=torch.bool))
            row_of[i] = b
            # Logits for token 0 come from the prompt's last position, token t from token t-1.
            src_pos[i] = base + torch.cat([torch.tensor([plen - 1]),
                                           torch.arange(offset, offset + k)])[:lengths[i]]
            offset += k
        ids_rows.append(torch.cat(ids))
        pos_rows.append(torch.cat(pos, 1))
        seg_rows.append(torch.cat(seg))
        valid_rows.append(torch.cat(valid))
        if "mm_token_type_ids" in prompt.tensors:
            type_rows.append(torch.cat([prompt.tensors["mm_token_type_ids"][0], *types]))
    if varlen:  # all groups in one row: no padding anywhere
        ids_rows, pos_rows, seg_rows, valid_rows = ([torch.cat(r, -1)] for r in
                                                    (ids_rows, pos_rows, seg_rows, valid_rows))
        type_rows = [torch.cat(type_rows)] if type_rows else []
    width = max(r.shape[0] for r in ids_rows)
    pad_fraction = 1.0 - sum(r.shape[0] for r in ids_rows) / (width * len(ids_rows))

    def pad(rows, value):
        return torch.stack([torch.cat([r, r.new_full((*r.shape[:-1], width - r.shape[-1]), value)], -1)
                            for r in rows])

    input_ids = pad(ids_rows, pad_id)
    seg = pad(seg_rows, -1)  # -1 marks right padding
    valid = pad(valid_rows, False)
    position_ids = pad(pos_rows, 0)  # [B, R, T]
    position_ids = position_ids.permute(1, 0, 2) if position_ids.shape[1] == 3 else position_ids[:, 0]
    mask = seg[:, None, None, :] if varlen else group_attention_mask(seg, valid)
    inputs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids}
    if type_rows:  # unused when positions are explicit, but kept for families that read it
        if len(type_rows) != len(ids_rows):
            raise ValueError("pack_groups: some prompts carry mm_token_type_ids and some do not")
        inputs["mm_token_type_ids"] = pad(type_rows, 0)
    inputs.update(_group_media(prompts, groups, observations))
    keep = torch.unique(torch.cat([s for s in src_pos if s.numel()] or [torch.zeros(1, dtype=torch.long)]))
    sources = [torch.searchsorted(keep, s) for s in src_pos]
    return Packed(inputs, keep, row_of, sources, lengths, pad_fraction)


def _group_media(prompts: Sequence[PromptFeatures], groups: list[list[int]],
                 observations: Sequence[Sequence[Observation]] | None) -> dict:
    """Media tensors in packed token order: each group's prompt media once, then its rows'
    observation media in row order."""
    media = [row_media(prompts[rows[0]].tensors, [o for i in rows for o in observations[i]]
                       if observations is not None else None) for rows in groups]
    out = {}
    for key in dict.fromkeys(k for m in media for k in m):
        parts = [m[key] for m in media if key in m]
        # One group's media (a long video) is the prompt's own tensor, not a copy of it.
        out[key] = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
    return out


def token_index(packed: Packed, width: int, device) -> tuple[torch.Tensor, ...]:
    """Every completion token's (packed row, index into `keep` of the position predicting it,
    flat slot in the [N, width] output), over all rows at once."""
    n = len(packed.lengths)
    rows = torch.cat([torch.full((packed.lengths[i],), packed.row_of[i]) for i in range(n)])
    cols = torch.cat([packed.sources[i] for i in range(n)])
    slots = torch.cat([i * width + torch.arange(packed.lengths[i]) for i in range(n)])
    return rows.to(device), cols.to(device), slots.to(device)


def group_attention_mask(seg: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool (True = attend) from segment ids [B, T] (0 prompt, j>0 completion j,
    -1 pad) and key validity [B, T]: causal, and a completion sees the prompt and itself only.
    The diagonal is always allowed so that no query row is fully masked (NaN in sdpa)."""
    t = seg.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
    same = seg[:, :, None] == seg[:, None, :]
    to_prompt = (seg == 0)[:, None, :] & valid[:, None, :]
    allowed = causal[None] & (to_prompt | (same & valid[:, None, :]))
    allowed |= torch.eye(t, dtype=torch.bool, device=seg.device)[None]
    return allowed[:, None]


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min)


def _takes_logits_index(model) -> bool:
    return "logits_to_keep" in inspect.signature(unwrap(model).forward).parameters


# ----------------------------------------------------------------------------- logprobs ---------

def shared_prefix_logprobs(model, prompts: Sequence[PromptFeatures], completion_ids: torch.Tensor,
                           completion_mask: torch.Tensor, *, temperature: float = 1.0,
                           return_entropy: bool = False, placeholder_ids: Sequence[int] = (),
                           pad_id: int = 0, stats: dict | None = None,
                           observations: Sequence[Sequence[Observation]] | None = None):
    """Same contract as `forward.completion_logprobs(model, collate(prompts, ids, mask,
    observations=observations), ids, mask, ...)`: [N, L] float32 log p(token | prefix) (and
    entropies), differentiable, but each group's prompt and media are computed once. Values
    where the mask is 0 are 0.

    `prompts` has one entry per row; rows answering the same prompt must share the object.
    Tool-use rows pass their `observations`; the group still shares its prompt.
    """
    check_no_placeholders(completion_ids, policy_token_mask(completion_mask, observations),
                          placeholder_ids)
    if not supports_shared_prefix(model):
        raise ValueError(f"shared-prefix layout needs an attention taking a 4-D mask "
                         f"({', '.join(MASKED_ATTENTION)}) or {prefix_attention.NAME!r}, "
                         f"not {attn_implementation(model)!r}")
    device = next(model.parameters()).device
    packed = pack_groups(model, prompts, completion_ids.cpu(), completion_mask.cpu(), pad_id,
                         varlen=uses_varlen(model), observations=observations)
    if stats is not None:
        stats["pad_fraction"] = packed.pad_fraction
        stats["rows_per_pack"] = len(packed.lengths) / len(group_rows(prompts))
    inputs = {k: v.to(device) for k, v in packed.inputs.items()}
    to_mask = MASKED_ATTENTION.get(attn_implementation(model))  # None: varlen takes the packing
    if to_mask is not None:
        inputs["attention_mask"] = to_mask(inputs["attention_mask"], next(model.parameters()).dtype)
    keep = packed.keep.to(device)
    if _takes_logits_index(model):
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits  # [B, K, V]
    else:  # e.g. Qwen2-Audio's forward has no logits_to_keep: full logits, then select
        logits = model(**inputs, use_cache=False).logits[:, keep]
    n, width = completion_ids.shape
    rows, cols, slots = token_index(packed, width, device)
    scaled = upcast(logits[rows, cols]) / temperature  # [tokens, V]
    lse = torch.logsumexp(scaled, dim=-1)
    targets = completion_ids.to(device).flatten()[slots]
    lp = scaled.gather(-1, targets[:, None]).squeeze(-1) - lse

    def to_rows(values):  # [tokens] -> [N, width], 0 where the mask is 0
        return values.new_zeros(n * width).index_put((slots,), values).view(n, width)

    if not return_entropy:
        return to_rows(lp)
    entropy = lse - (torch.softmax(scaled, dim=-1) * scaled).sum(-1)
    return to_rows(lp), to_rows(entropy)


# ----------------------------------------------------------------------------- micro-batches ----

def token_budget_micro_batches(prompts: Sequence[PromptFeatures], completion_mask: torch.Tensor,
                               max_tokens: int, *, shared_prefix: bool = True, padded: bool = True,
                               min_batches: int = 1) -> list[list[int]]:
    """Rows partitioned into as few micro-batches as fit `max_tokens` tokens per forward (at
    least `min_batches`, e.g. the most any data-parallel rank needs, so every rank runs as many
    forwards; at most one per item), as verl's dynamic batch size does. The loss normaliser is
    global, so any partition gives the same loss and gradients.

    Items: whole groups under `shared_prefix` (the prompt once + its completions; a group over
    the budget is cut into runs of rows that fit, each run paying the prompt again), else rows
    (prompt + completion). `padded`: a forward pads its items to the longest one (naive rows; the
    dense 4-D group mask), so it costs items x longest: items go longest-first into consecutive
    micro-batches, which keeps alike lengths together. Unpadded (the varlen kernel packs groups
    with no pad): a forward costs the sum, and items go longest-first to the least-filled
    micro-batch, which balances them. A single row over the budget gets a micro-batch alone.
    """
    lengths = completion_mask.long().sum(1).tolist()
    items = _budget_items(prompts, lengths, max_tokens, shared_prefix)
    items.sort(key=lambda item: -item[0])
    if padded:
        batches: list[list[tuple[int, list[int]]]] = []
        for item in items:  # longest first: a batch's first item is its widest
            if not batches or (len(batches[-1]) + 1) * batches[-1][0][0] > max_tokens:
                batches.append([])
            batches[-1].append(item)
        while len(batches) < min(min_batches, len(items)):  # halve the costliest batch
            big = max((b for b in batches if len(b) > 1), key=lambda b: len(b) * b[0][0])
            batches.remove(big)
            batches += [big[:len(big) // 2], big[len(big) // 2:]]
    else:
        alone = sum(1 for c, _ in items if c > max_tokens)  # each needs a micro-batch of its own
        count = max(min_batches, alone - (-sum(c for c, _ in items if c <= max_tokens) // max_tokens))
        while True:
            count = min(count, len(items))
            batches = [[] for _ in range(count)]
            loads = [0] * count
            for item in items:
                k = loads.index(min(loads))
                batches[k].append(item)
                loads[k] += item[0]
            if count == len(items) or all(load <= max_tokens or len(b) == 1
                                          for load, b in zip(loads, batches)):
                break
            count += 1
    return [sorted(i for _, rows in batch for i in rows) for batch in batches if batch]


def _budget_items(prompts, lengths: list[int], max_tokens: int, shared: bool) -> list[tuple[int, list[int]]]:
    """(tokens, rows) per packing item: rows alone, or groups (cut into runs over the budget)."""
    if not shared:
        return [(p.tensors["input_ids"].shape[1] + n, [i]) for i, (p, n) in enumerate(zip(prompts, lengths))]
    items = []
    for rows in group_rows(prompts):
        plen = prompts[rows[0]].tensors["input_ids"].shape[1]
        run, used = [], plen
        for i in rows:
            if run and used + lengths[i] > max_tokens:
                items.append((used, run))
                run, used = [], plen
            run.append(i)
            used += lengths[i]
        items.append((used, run))
    return items
