"""vLLM prompt and output conversions shared by the colocated engine (rollout/vllm.py) and the
server client (rollout/vllm_server.py): the trainer's PromptFeatures -> a vLLM request (token ids
with one pad per media item, decoded media alongside), token bans, stop tokens, and vLLM's
sampled rows -> a `Generation`. Imports no vLLM, so it is testable without the engine.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from mmrl.models.forward import Generation, check_no_placeholders
from mmrl.types import AUDIO_SAMPLING_RATE, PromptFeatures


def media_pad_ids(processor) -> dict[str, int]:
    """{vLLM modality: placeholder id} for the pads that vLLM expands itself."""
    tokenizer = getattr(processor, "tokenizer", processor)
    vocab = tokenizer.get_vocab()
    out = {}
    for modality, attr in (("image", "image_token"), ("video", "video_token"), ("audio", "audio_token")):
        token = getattr(processor, attr, None) or getattr(tokenizer, attr, None)
        if isinstance(token, str) and token in vocab:
            out[modality] = vocab[token]
    return out


def frame_marks(processor) -> tuple[int, int] | None:
    """(vision start id, vision end id) when the processor writes each video frame as its own
    block after a timestamp (Qwen3-VL: `vs [<t seconds> vs pads ve]*T ve`), else None."""
    if not hasattr(processor, "_calculate_timestamps"):  # Qwen3-VL's processor computes them
        return None
    tokenizer = getattr(processor, "tokenizer", processor)
    return tuple(tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))


def fold_frame_blocks(ids: Sequence[int], video_pad: int, marks: tuple[int, int]) -> list[int]:
    """Each video written as timestamped frame blocks inside one outer block -> the outer block
    around one video pad: the prompt vLLM expands again, timestamps included (Qwen3-VL). Image
    blocks (no block nested inside) are kept.

    >>> fold_frame_blocks([1, 5, 3, 5, 9, 9, 6, 3, 5, 9, 9, 6, 6, 5, 8, 6, 2], 9, (5, 6))
    [1, 5, 9, 6, 5, 8, 6, 2]
    """
    start, end = marks
    out: list[int] = []
    depth, outer, nested = 0, 0, False
    for i in ids:
        if i == start:
            depth += 1
            if depth == 1:
                outer = len(out)
                out.append(i)
            elif not nested:  # the first frame block: the outer one is a video
                del out[outer + 1:]  # the first frame's timestamp
                out.append(video_pad)
                nested = True
        elif i == end:
            depth -= 1
            if depth == 0:
                out.append(i)
                nested = False
        elif not (nested and depth >= 1):  # timestamps and pads inside a video are vLLM's
            out.append(i)
    return out


def collapse_media_pads(ids: Sequence[int], pad_ids: Sequence[int]) -> list[int]:
    """Each run of one repeated media pad id -> a single pad (vLLM re-expands it).

    >>> collapse_media_pads([1, 7, 7, 7, 2, 1, 7, 7, 2, 8, 8], [7, 8])
    [1, 7, 2, 1, 7, 2, 8]
    """
    pads, out = set(pad_ids), []
    for i in ids:
        if i in pads and out and out[-1] == i:
            continue
        out.append(i)
    return out


def prompt_media(prompt: PromptFeatures) -> dict[str, list]:
    """The decoded media of a prompt: `prompt.media` ({"images", "videos", "audios"}) when the
    trainer kept it, else decoded again from the sample's paths (once: stored on the object)."""
    media = getattr(prompt, "media", None)
    if media is None:
        s = prompt.sample
        if not (s.images or s.videos or s.audios):
            return {}
        from mmrl.data.media import load_media

        media = load_media(s)
        try:
            prompt.media = media
        except AttributeError:  # pragma: no cover - a slotted PromptFeatures
            pass
    return media


def multi_modal_data(prompt: PromptFeatures) -> dict[str, list]:
    """vLLM's `multi_modal_data` for one prompt: PIL images, (frames, metadata) videos,
    (waveform, 16000) audios."""
    from mmrl.models.base import video_frames, video_metadata

    media, data = prompt_media(prompt), {}
    if media.get("images"):
        data["image"] = [im.convert("RGB") if getattr(im, "mode", "RGB") != "RGB" else im
                         for im in media["images"]]
    if media.get("videos"):
        videos = []
        for video in media["videos"]:
            frames, fps = video_frames(video, getattr(video, "fps", None))
            videos.append((frames, dict(video_metadata(frames, fps), do_sample_frames=False)))
        data["video"] = videos
    if media.get("audios"):
        data["audio"] = [(np.asarray(a, dtype=np.float32).reshape(-1), AUDIO_SAMPLING_RATE)
                         for a in media["audios"]]
    return data


def describe(prompt: PromptFeatures) -> str:
    s = prompt.sample
    return f"sample {s.id!r}" + (f" ({s.source})" if s.source else "")


def build_request(prompt: PromptFeatures, pads: dict[str, int],
                  marks: tuple[int, int] | None = None) -> dict:
    """{"prompt_token_ids", "multi_modal_data"} for one prompt, pads collapsed (and timestamped
    video frame blocks folded, given `marks`: frame_marks); ValueError when the number of pad
    runs and of media items differ."""
    ids = prompt.input_ids.tolist()
    if marks is not None and "video" in pads:
        ids = fold_frame_blocks(ids, pads["video"], marks)
    collapsed = collapse_media_pads(ids, list(pads.values()))
    data = multi_modal_data(prompt)
    for modality, pad in pads.items():
        runs, items = collapsed.count(pad), len(data.get(modality, ()))
        if runs != items:
            raise ValueError(f"{describe(prompt)}: {runs} {modality} placeholder(s) in the prompt but "
                             f"{items} {modality} item(s) to send to vLLM (set PromptFeatures.media "
                             f"to the decoded media the processor was called with)")
    request: dict[str, Any] = {"prompt_token_ids": collapsed}
    if data:
        request["multi_modal_data"] = data
    if "video" in data:
        request["mm_processor_kwargs"] = {"do_sample_frames": False}
    return request


def ban_fields(tokenizer, token_ids: Sequence[int]) -> dict:
    """SamplingParams fields that forbid `token_ids`: `bad_words` (logit -inf) for tokens whose
    text encodes back to exactly that one id (special tokens such as the media placeholders),
    else a -100 logit bias (vLLM's clamp; exp(-100) is 0 in float32)."""
    words, bias = [], {}
    for token_id in sorted(set(int(i) for i in token_ids)):
        token = tokenizer.convert_ids_to_tokens(token_id)
        if tokenizer.encode(token, add_special_tokens=False) == [token_id]:
            words.append(token)
        else:
            bias[token_id] = -100.0
    return {"bad_words": words or None, "logit_bias": bias or None}


def eos_token_ids(model, processor) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(processor, "tokenizer", processor).eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def to_generation(rows: Sequence[tuple[Sequence[int], Sequence[float], bool]], pad_id: int,
                  placeholder_ids: Sequence[int] = ()) -> Generation:
    """Generation from per-row (token ids, sampled-token logprobs, stopped by length)."""
    width = max([1] + [len(ids) for ids, _, _ in rows])
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    logp = torch.zeros((n, width), dtype=torch.float32)
    truncated = torch.zeros(n, dtype=torch.bool)
    for r, (tokens, lps, by_length) in enumerate(rows):
        k = len(tokens)
        if len(lps) != k:
            raise RuntimeError(f"row {r}: {k} tokens but {len(lps)} logprobs from the sampler")
        if k:
            ids[r, :k] = torch.as_tensor(list(tokens), dtype=torch.long)
            logp[r, :k] = torch.as_tensor(list(lps), dtype=torch.float32)
            mask[r, :k] = 1
        truncated[r] = bool(by_length)
    check_no_placeholders(ids, mask, placeholder_ids)
    return Generation(ids, mask, logp, truncated)
