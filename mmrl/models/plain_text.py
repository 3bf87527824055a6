"""Text that is data, never markup: what a tool returned, or an error observation echoing the
model's own call, is encoded so that no piece of it becomes a special token.

The processor expands media placeholders by string (`<|image_pad|>`, Omni's `<|IMAGE|>`, its
internal `<|image_placeholder|>`) and the tokenizer matches its added tokens by string
(`<|im_end|>`, `<|im_start|>`): a tool result holding `<|image_pad|>` would ask for an image that
is not there (the processor fails with StopIteration), and `<|im_end|><|im_start|>assistant` would
forge a chat turn. So each data string is rendered into the chat template as a marker, and every
markup-looking piece of it is handed to the processor as one sentinel special token (which splits
the text there exactly as the original special token did, so the text around it tokenizes as
before); after the processor, each sentinel is replaced by the piece's ordinary byte-level tokens.
Data without such pieces goes through the processor unchanged (bit-identical to plain encoding).
"""
from __future__ import annotations

import functools
import re
from typing import Sequence

import torch

from mmrl.models.base import TOKEN_KEYS
from mmrl.models.codec import Codec

# Markup the processors replace by string though it may be no token (Qwen2.5-Omni's
# <|image_placeholder|>, ...): every `<|name|>` is treated as markup, with the added tokens.
_PIPE_TAG = r"<\|[A-Za-z0-9_.:-]{1,64}\|>"
_MARKER = "MMRL_DATA_{}_c41f"
_MARKER_RE = re.compile(r"MMRL_DATA_(\d+)_c41f")


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


@functools.lru_cache(maxsize=16)
def _markup(tokenizer) -> tuple[re.Pattern, frozenset[int]]:
    """(a regex of every markup string: the added tokens, longest first, and `<|name|>`, the
    ids of the added tokens)."""
    added = {str(t): i for i, t in tokenizer.added_tokens_decoder.items()} \
        if hasattr(tokenizer, "added_tokens_decoder") else {}
    names = sorted((s for s in added if s), key=len, reverse=True)
    return (re.compile("|".join([*map(re.escape, names), _PIPE_TAG])),
            frozenset(added.values()))


def markup_in(tokenizer, text: str) -> list[str]:
    """The markup pieces of `text`, in order (what `encode_with_data` neutralises)."""
    return _markup(tokenizer)[0].findall(text)


def plain_ids(tokenizer, text: str) -> list[int]:
    """`text` as ordinary tokens: the tokenizer's normaliser, pre-tokenizer and model, never its
    added vocabulary (so `<|im_end|>` is `<|`, `im`, `_end`, `|>`). Decodes back to `text`."""
    added = _markup(tokenizer)[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: special tokens split, checked below
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    else:
        norm = backend.normalizer.normalize_str(text) if backend.normalizer else text
        pieces = backend.pre_tokenizer.pre_tokenize_str(norm) if backend.pre_tokenizer \
            else [(norm, None)]
        ids = [t.id for piece, _ in pieces for t in backend.model.tokenize(piece)]
    if any(i in added for i in ids):  # a BPE vocabulary holding the whole tag: char by char
        ids = [i for ch in text for i in plain_ids(tokenizer, ch)] if len(text) > 1 else ids
    if any(i in added for i in ids):
        raise ValueError(f"{text!r} has no encoding as plain text in this tokenizer")
    return ids


def _sentinel(processor, text: str) -> tuple[str, int]:
    """A special token the template text does not hold and no processor expands: each data
    markup piece stands in the processor's text as it, then becomes its plain tokens."""
    tok = _tokenizer(processor)
    media = {v for obj in (processor, tok) for k, v in vars(obj).items()
             if k.endswith("_token") and isinstance(v, str)}
    specials = [str(t) for _, t in sorted(tok.added_tokens_decoder.items())
                if getattr(t, "special", True)]
    for s in ([tok.pad_token] if tok.pad_token in specials else []) + specials:
        if s not in media and s not in text:
            return s, tok.convert_tokens_to_ids(s)
    raise ValueError("the tokenizer has no special token free to stand in for data markup")


def with_markers(results: Sequence[Sequence[dict]]) -> tuple[list[list[dict]], list[str]]:
    """(`results` with each text item's text replaced by a marker, the texts by marker index):
    what the chat template writes around a result is markup, the result's own text is data."""
    data: list[str] = []
    marked = []
    for result in results:
        items = []
        for item in result:
            if item.get("type") == "text":
                items.append({**item, "text": _MARKER.format(len(data))})
                data.append(str(item["text"]))
            else:
                items.append(item)
        marked.append(items)
    return marked, data


def fill(text: str, data: Sequence[str], escape=lambda s: s) -> str:
    """`text` with every marker replaced by its data string (through `escape`)."""
    return _MARKER_RE.sub(lambda m: escape(data[int(m.group(1))]), text)


def encode_with_data(codec: Codec, text: str, data: Sequence[str],
                     **media) -> dict[str, torch.Tensor]:
    """`codec.encode` of `text` with its markers filled by `data`, every markup piece of the
    data encoded as plain text (see the module doc)."""
    processor = codec.processor
    tok = _tokenizer(processor)
    pattern = _markup(tok)[0]
    pieces: list[str] = []
    if not any(pattern.search(s) for s in data):
        return codec.encode(fill(text, data), **media)
    sentinel, sid = _sentinel(processor, fill(text, [""] * len(data)))

    def escape(s: str) -> str:
        def stand_in(m: re.Match) -> str:
            pieces.append(m.group(0))
            return sentinel
        return pattern.sub(stand_in, s)

    tensors = codec.encode(fill(text, data, escape), **media)
    ids = tensors["input_ids"][0]
    at = (ids == sid).nonzero().flatten().tolist()
    if len(at) != len(pieces):
        raise RuntimeError(f"{len(pieces)} data markup pieces stood in as {sentinel}, but the "
                           f"processor's tokens hold {len(at)}")
    plain = [plain_ids(tok, p) for p in pieces]
    for key in TOKEN_KEYS:
        if key not in tensors:
            continue
        row, parts, last = tensors[key][0], [], 0
        for pos, p in zip(at, plain):
            fill_value = torch.tensor(p) if key == "input_ids" else \
                torch.full((len(p),), int(key == "attention_mask"))
            parts += [row[last:pos], fill_value.to(row.dtype)]
            last = pos + 1
        tensors[key] = torch.cat(parts + [row[last:]])[None]
    return tensors
