"""Media embeddings computed outside the family's own forward and spliced into its text embeddings.

Two mechanisms need the vision/audio encoders run somewhere else than inside the model's
forward: sequence parallelism (each rank encodes its own shard of the media and the embeddings
are gathered, models/ulysses.py) and the encoder cache (a frozen encoder runs once per prompt
per step, models/encoder_cache.py). Both go through one seam:

    with splice_media(model, provider):
        model(**inputs)            # any caller: forward.completion_logprobs, shared_prefix, ...

Inside, a forward pre-hook on the multimodal model takes the encoder inputs (`pixel_values`,
`pixel_values_videos`, `input_features`) out of its call, so its own encoders do not run; grids,
`feature_attention_mask` and `second_per_grid_ts` stay, so positions are computed as before. A
pre-hook on the text decoder then writes `provider(owner, kind, tensors)` ([tokens, D] per media
kind, in item order) into the placeholder positions of `inputs_embeds` with `masked_scatter`, as
the family's forward does. So the model runs through its wrappers (DDP, DeepSpeed, FSDP2, peft)
unchanged, with the same numbers; `shard=(lo, hi)` also cuts the decoder's input to one
sequence shard (sequence parallelism).

Media split into *units* for sharding: a visual item splits along time (Qwen2-VL / 2.5-VL /
Omni vision towers attend within each temporal patch, with 2-D positions, so a video's frames
encode independently and their tokens come out time-major), an audio item stays whole.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from mmrl.models.shared_prefix import unwrap
from mmrl.models.towers import model_parts

# media kind -> (the encoder input the family's forward must not see, the other tensors that
# describe the items, the config attribute naming the placeholder token)
KINDS = {"images": ("pixel_values", ("image_grid_thw",), "image_token_id"),
         "videos": ("pixel_values_videos", ("video_grid_thw",), "video_token_id"),
         "audios": ("input_features", ("feature_attention_mask",), "audio_token_id")}

Provider = Callable[[torch.nn.Module, str, dict], torch.Tensor]


def present_kinds(tensors: dict) -> list[str]:
    return [kind for kind, (heavy, _, _) in KINDS.items() if tensors.get(heavy) is not None]


def kind_tensors(tensors: dict, kind: str) -> dict:
    heavy, extra, _ = KINDS[kind]
    return {k: tensors[k] for k in (heavy, *extra) if tensors.get(k) is not None}


# ----------------------------------------------------------------------------- encoding ---------

def encode(owner, kind: str, tensors: dict) -> torch.Tensor:
    """[tokens, D] embeddings of every `kind` item in `tensors` (item order), exactly as the
    family's forward computes them before writing them into its placeholder positions. Inputs
    may sit on the host: they move to the encoder's device here."""
    device = next(owner.parameters()).device
    tensors = {k: v.to(device) for k, v in tensors.items()}
    if kind == "images":
        out = owner.get_image_features(tensors["pixel_values"], tensors["image_grid_thw"],
                                       return_dict=True)
    elif kind == "videos":
        out = owner.get_video_features(tensors["pixel_values_videos"], tensors["video_grid_thw"],
                                       return_dict=True)
    elif hasattr(owner, "get_audio_features"):  # Qwen2.5-Omni: tower + projection in one
        return owner.get_audio_features(tensors["input_features"], tensors["feature_attention_mask"],
                                        return_dict=True).last_hidden_state
    else:
        return _qwen2_audio_features(owner, tensors["input_features"], tensors["feature_attention_mask"])
    if getattr(out, "deepstack_features", None) is not None:
        raise NotImplementedError(
            f"{type(owner).__name__}: its vision tower also returns deepstack features, which "
            f"the spliced forward does not carry yet (sequence parallelism / encoder cache)")
    return torch.cat(out.pooler_output, 0)


def _qwen2_audio_features(owner, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Qwen2-Audio's forward has no `get_audio_features`: its tower under a bidirectional mask
    over each audio's real frames, the projector, then each audio cut to its own token count."""
    from transformers.masking_utils import create_bidirectional_mask

    tower = owner.audio_tower
    lengths, out_lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
    n, _, mel = features.shape
    width = (mel - 2) // 2 + 1
    valid = torch.arange(width, device=lengths.device)[None] < lengths[:, None]
    attention = create_bidirectional_mask(config=tower.config, attention_mask=valid.long(),
                                          inputs_embeds=features.new_zeros(n, width, 1))
    hidden = tower(features, attention_mask=attention).last_hidden_state
    projected = owner.multi_modal_projector(hidden)
    keep = torch.arange(projected.shape[1], device=projected.device)[None] < out_lengths[:, None].to(projected.device)
    return projected[keep]


def encoder_modules(owner, kind: str) -> dict[str, torch.nn.Module]:
    """{attribute: module} that `encode(owner, kind, ...)` runs (whether its output can be
    cached, whether its gradient is gathered)."""
    names = {"images": ("visual", "vision_tower"), "videos": ("visual", "vision_tower"),
             "audios": ("audio_tower", "multi_modal_projector")}[kind]
    return {n: getattr(owner, n) for n in names if isinstance(getattr(owner, n, None), torch.nn.Module)}


def owner_of(model) -> torch.nn.Module:
    owner, _ = model_parts(unwrap(model))
    if owner is None:
        raise ValueError(f"{type(unwrap(model)).__name__}: found no multimodal module with encoders")
    return owner


# ----------------------------------------------------------------------------- units ------------

@dataclass(frozen=True)
class Unit:
    """The part of one item that encodes on its own: temporal patches [t0, t1) of a visual item,
    or a whole audio (t0 = 0, t1 = 1)."""

    item: int
    t0: int
    t1: int
    cost: int  # encoder input rows (patches or mel frames): what a rank's share is balanced on


def media_units(kind: str, tensors: dict) -> list[Unit]:
    """The finest units of `kind` in item order, time-major within an item."""
    if kind == "audios":
        frames = tensors["feature_attention_mask"].sum(-1).tolist()
        return [Unit(i, 0, 1, int(f)) for i, f in enumerate(frames)]
    grid = tensors[KINDS[kind][1][0]].tolist()
    return [Unit(i, t, t + 1, h * w) for i, (frames, h, w) in enumerate(grid) for t in range(frames)]


def select_units(kind: str, tensors: dict, units: list[Unit]) -> dict:
    """The encoder inputs of `units` (contiguous runs of one item merge into one sub-item)."""
    if kind == "audios":
        index = torch.tensor([u.item for u in units], dtype=torch.long)
        return {k: v.index_select(0, index.to(v.device)) for k, v in tensors.items()}
    heavy, (grid_key,), _ = KINDS[kind]
    grid = tensors[grid_key]
    rows_per_item = grid.prod(-1).tolist()
    starts = [0]
    for n in rows_per_item[:-1]:
        starts.append(starts[-1] + n)
    runs: list[list[int]] = []  # [item, t0, t1]
    for u in units:
        if runs and runs[-1][0] == u.item and runs[-1][2] == u.t0:
            runs[-1][2] = u.t1
        else:
            runs.append([u.item, u.t0, u.t1])
    pixels, grids = [], []
    for item, t0, t1 in runs:
        _, h, w = grid[item].tolist()
        first = starts[item] + t0 * h * w
        pixels.append(tensors[heavy][first:first + (t1 - t0) * h * w])
        grids.append(torch.tensor([t1 - t0, h, w], dtype=grid.dtype))
    # One run (what a rank's share of one video is) stays a view of the input: no copy.
    return {heavy: pixels[0] if len(pixels) == 1 else torch.cat(pixels),
            grid_key: torch.stack(grids).to(grid.device)}


def balanced_ranges(costs: list[int], parts: int) -> list[tuple[int, int]]:
    """Cut a sequence into `parts` contiguous [start, end) ranges of about equal total cost: a
    unit goes to the part where the midpoint of its cost falls."""
    total = sum(costs) or 1
    bounds, acc = [0] * (parts + 1), 0.0
    bounds[parts] = len(costs)
    cuts = [0] * len(costs)
    for i, c in enumerate(costs):
        cuts[i] = min(parts - 1, int((acc + c / 2) * parts / total))
        acc += c
    for p in range(1, parts):
        bounds[p] = next((i for i, part in enumerate(cuts) if part >= p), len(costs))
    return [(bounds[p], bounds[p + 1]) for p in range(parts)]


# ----------------------------------------------------------------------------- splice -----------

def local_encoder(owner, kind: str, tensors: dict) -> torch.Tensor:
    """The provider that encodes everything here: what the family's own forward would do."""
    return encode(owner, kind, tensors)


@contextmanager
def splice_media(model, provider: Provider, shard: tuple[int, int] | None = None):
    """Inside: forwards of `model` take their media embeddings from `provider` (see the module
    docstring); with `shard=(lo, hi)` the text decoder runs on sequence positions lo..hi-1 only
    (its `inputs_embeds` and `position_ids` cut; the attention mask stays whole)."""
    owner, decoder = model_parts(unwrap(model))
    if owner is None:
        raise ValueError(f"{type(unwrap(model)).__name__}: found no multimodal module with encoders")
    stash: dict = {}

    def take_media(module, args, kwargs):
        stash.clear()
        stash["input_ids"] = kwargs.get("input_ids")
        for kind in present_kinds(kwargs):
            stash[kind] = kind_tensors(kwargs, kind)
        heavy = {KINDS[kind][0] for kind in KINDS}
        return args, {k: (None if k in heavy else v) for k, v in kwargs.items()}

    def put_media(module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise ValueError("splice_media: the text decoder was called without inputs_embeds")
        ids = stash.get("input_ids")
        lo, hi = shard or (0, embeds.shape[1])
        embeds = embeds[:, lo:hi]  # the decoder's own shard: nothing whole is kept
        for kind in KINDS:
            if kind not in stash:
                continue
            features = provider(owner, kind, stash[kind]).to(embeds.device, embeds.dtype)
            where = (ids == getattr(owner.config, KINDS[kind][2])).to(embeds.device)
            if int(where.sum()) != features.shape[0]:
                raise ValueError(f"{kind} features and placeholder tokens do not match: "
                                 f"{int(where.sum())} tokens, {features.shape[0]} features")
            if shard is not None:  # the features of this shard's placeholders, in order
                order = where.flatten().cumsum(0).view_as(where)[:, lo:hi] - 1
                where = where[:, lo:hi]
                features = features[order[where]]
            embeds = embeds.masked_scatter(where[..., None], features)
        kwargs = dict(kwargs, inputs_embeds=embeds)
        if shard is not None and kwargs.get("position_ids") is not None:
            kwargs["position_ids"] = kwargs["position_ids"][..., lo:hi]
        return args, kwargs

    hooks = [owner.register_forward_pre_hook(take_media, with_kwargs=True),
             decoder.register_forward_pre_hook(put_media, with_kwargs=True, prepend=True)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
