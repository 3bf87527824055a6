"""Observation turns of tool-use trajectories: rendered by the chat template, encoded by the
processor on the NEW content only, and laid out for the training forward.

A trajectory is one sequence: [prompt | model turn | observation | model turn | ...]. The model's
tokens are never re-tokenized; an observation's text is what the family's chat template writes
after a model turn that ended on its end-of-turn token, up to and including the next assistant
header, and `ModelAdapter.encode` turns it (with the tool results' media) into tokens with every
placeholder expanded. Positions are never extended turn by turn: M-RoPE restarts text after a
vision block at the block's largest position + 1, so the forward computes them once over the
whole row with every grid in order (`row_media` gives the order: the prompt's media, then each
observation's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from mmrl.models.base import TOKEN_KEYS
from mmrl.models.codec import Codec
from mmrl.models.plain_text import encode_with_data, fill, with_markers
from mmrl.types import Observation

# Assistant content that marks where a model turn ends in a rendered conversation.
_TURN_END = "MMRL_TURN_END_b81c"
_PROBE = "MMRL_PROBE_4e2d"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"


@dataclass(frozen=True)
class ObservationStyle:
    """How tool results become a turn under a processor's chat template."""

    role: str  # the message role results are sent as
    wrap: bool  # True: each result wrapped in <tool_response> text here (the template does not)
    reason: str  # one line for the config summary


def observation_style(processor) -> ObservationStyle:
    """The chat template's own tool role when it has one (Qwen3-VL's renders role "tool" as a
    user turn of <tool_response> blocks); else user turns with each result wrapped in
    <tool_response> tags, the form Qwen's tool templates render (Qwen2.5-VL's processor template
    has no tool role and would write a bare `<|im_start|>tool` header the model never saw)."""
    probe = [{"role": "tool", "content": [{"type": "text", "text": _PROBE}]}]
    text = _render(processor, probe)
    if RESPONSE_OPEN.strip() in text:
        return ObservationStyle("tool", False, "observations: the chat template's tool role")
    return ObservationStyle("user", True, "observations: user turns of <tool_response> blocks "
                            "(the chat template has no tool role)")


def observation_messages(results: Sequence[Sequence[dict]], style: ObservationStyle) -> list[dict]:
    """Chat messages for one observation turn answering a model turn's calls: `results` holds,
    per call in order, its content items ({"type": "image"}, {"type": "text", "text": ...}, ...)."""
    if not style.wrap:
        return [{"role": style.role, "content": list(r)} for r in results]
    content: list[dict] = []
    for i, result in enumerate(results):
        opening = ("\n" if i else "") + RESPONSE_OPEN
        content += [{"type": "text", "text": opening}, *result,
                    {"type": "text", "text": RESPONSE_CLOSE}]
    return [{"role": style.role, "content": content}]


def _render(processor, messages: list[dict]) -> str:
    """What the template writes after an assistant turn, for `messages` that follow it."""
    conversation = [{"role": "system", "content": "S"},
                    {"role": "assistant", "content": _TURN_END}, *messages]
    full = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    _, found, tail = full.partition(_TURN_END)
    if not found:
        raise ValueError("the chat template dropped an assistant turn's content; observation turns "
                         "cannot be rendered with it")
    return tail


def observation_text(processor, messages: list[dict], after: str) -> str:
    """The text of an observation turn: what the chat template writes between a model turn and
    the next one (end-of-turn separators, the observation messages, the next assistant header).
    `after` is the text of the model turn's last token: when the template ends assistant turns
    with that same token (<|im_end|>), the model already wrote it and it is not repeated."""
    tail = _render(processor, messages)
    return tail[len(after):] if after and tail.startswith(after) else tail


def encode_observation(codec: Codec, results: Sequence[Sequence[dict]], media: dict,
                       after: str, start: int,
                       style: ObservationStyle | None = None) -> tuple[torch.Tensor, Observation]:
    """(token ids [n], Observation) of one observation turn at completion position `start`.
    `media` holds the results' decoded items by kind ("images", "videos", "audios"), in the
    order their items appear in `results`; the processor expands each placeholder. The results'
    text is data: no piece of it becomes a special token (mmrl/models/plain_text.py)."""
    style = style or observation_style(codec.processor)
    marked, data = with_markers(results)  # the results' text is data, the template's markup
    marked_text = observation_text(codec.processor, observation_messages(marked, style), after)
    text = fill(marked_text, data)
    tensors = encode_with_data(codec, marked_text, data,
                               images=media.get("images") or None,
                               videos=media.get("videos") or None,
                               audios=media.get("audios") or None)
    ids = tensors.pop("input_ids")[0]
    tensors.pop("attention_mask", None)
    types = tensors.pop("mm_token_type_ids", None)
    if types is not None:
        tensors["mm_token_type_ids"] = types[0]
    return ids, Observation(start=start, length=int(ids.shape[0]), tensors=tensors, text=text,
                            media={k: list(v) for k, v in media.items() if v})


# ------------------------------------------------------------------ rows in the forward ------

def row_media(prompt_tensors: dict, observations: Sequence[Observation] | None) -> dict:
    """A row's media tensors in sequence order: the prompt's, then each observation's."""
    keys = [k for k in prompt_tensors if k not in TOKEN_KEYS]
    for o in observations or ():
        keys += [k for k in o.tensors if k not in TOKEN_KEYS and k not in keys]
    out = {}
    for key in keys:
        parts = [prompt_tensors[key]] if key in prompt_tensors else []
        parts += [o.tensors[key] for o in observations or () if key in o.tensors]
        out[key] = parts[0] if len(parts) == 1 else torch.cat(parts, 0)  # a long video: no copy
    return out


def check_spans(observations: Sequence[Observation], length: int) -> None:
    """ValueError unless the observations sit in order, apart, inside `length` tokens."""
    end = 0
    for o in observations:
        if o.start < end or o.start + o.length > length:
            raise ValueError(f"observation at tokens {o.start}..{o.start + o.length} does not fit a "
                             f"completion of {length} tokens after one ending at {end}; a cut "
                             f"inside an observation must drop it and its media")
        end = o.start + o.length


def completion_token_types(observations: Sequence[Observation] | None, width: int) -> torch.Tensor:
    """[width] mm_token_type_ids of a completion: 0 on model text, the observations' own types
    on their tokens."""
    types = torch.zeros(width, dtype=torch.long)
    check_spans(observations or (), width)
    for o in observations or ():
        if "mm_token_type_ids" in o.tensors:
            types[o.start:o.start + o.length] = o.tensors["mm_token_type_ids"]
    return types


def observation_mask(observations: Sequence[Observation] | None, width: int) -> torch.Tensor:
    """[width] bool, True on observation tokens."""
    mask = torch.zeros(width, dtype=torch.bool)
    check_spans(observations or (), width)
    for o in observations or ():
        mask[o.start:o.start + o.length] = True
    return mask


def policy_token_mask(completion_mask: torch.Tensor,
                      observations: Sequence[Sequence[Observation]] | None) -> torch.Tensor:
    """[N, L] completion_mask without the observation tokens: the tokens the policy sampled."""
    if observations is None:
        return completion_mask
    width = completion_mask.shape[1]
    obs = torch.stack([observation_mask(o, width) for o in observations]).to(completion_mask.device)
    return completion_mask * ~obs
