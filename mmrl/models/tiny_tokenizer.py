"""A small byte-level BPE tokenizer for tiny offline models, trained in-process (no download).

Why train one instead of shipping Qwen's 151k vocabulary: the LM head of a tiny model would be
99% vocabulary, and a real tokenizer cannot be fetched offline. Why byte-level BPE with Qwen2's
pre-tokenizer: any text round-trips (rewards parse decoded text), and the merges behave like the
real Qwen tokenizer's (digits split one by one, "<answer" is one piece).

The reasoning/answer tags stay ordinary text (not added tokens) so that decoded completions parse
exactly as a real model's would; the corpus repeats them so BPE learns them as few tokens.
"""
from __future__ import annotations

import functools
import json
import random

# Order matters: ids are assigned in this order right after the BPE vocabulary, so the same
# tokens get the same ids for every family (image/video/audio/omni reuse one tokenizer).
SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<|endoftext|>",
    "bos_chat": "<|im_start|>",
    "eos_token": "<|im_end|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
    "vision_pad_token": "<|vision_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    # Qwen2.5-Omni names its placeholders differently from Qwen2-VL / Qwen2-Audio.
    "omni_image_token": "<|IMAGE|>",
    "omni_video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}

# Every media pad or boundary token: never a valid completion token.
PLACEHOLDER_TOKENS: tuple[str, ...] = (
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|IMAGE|>", "<|VIDEO|>",
    "<|vision_bos|>", "<|vision_eos|>",
)

# Dispatches on content['type'] only: rows from `datasets` carry every key of every content type
# (None-valued), so `'image' in item` or `item.image is defined` would misfire on text items.
CHAT_TEMPLATE = (
    # Newlines are emitted as {{ '\\n' }} expressions because `-%}` trimming would eat literal ones.
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}{{ '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or item['type'] == 'image_url' -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif item['type'] == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif item['type'] == 'audio' -%}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)

_WORDS = (
    "how many red blue green yellow white black squares circles triangles objects shapes cars "
    "people dogs cats birds are there is in the image video audio picture frame clip sound "
    "answer with a number only count output bounding box of which option correct choose letter "
    "what color shape left right top bottom center corner first second third last when does "
    "event start end seconds happen speaker say transcribe speech music noise question describe "
    "find locate object largest smallest one two three four five six seven eight nine ten yes no "
    "think step by please reason then give final between and or not this that it you your to "
    "for on at from as be can will should must format coordinates x y width height time"
).split()


def _corpus_lines(n: int = 3000, seed: int = 0) -> list[str]:
    """Synthetic task-like lines: prompts, tagged answers, boxes, options, numbers."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        num = rng.choice([str(rng.randint(0, 9)), str(rng.randint(0, 999)), f"{rng.random():.2f}"])
        box = "[" + ", ".join(str(rng.randint(0, 640)) for _ in range(4)) + "]"
        opt = rng.choice("ABCD")
        kind = rng.randrange(5)
        if rng.random() < 0.2:  # chat role headers, as rendered by the template
            lines.append(f"{rng.choice(['user', 'assistant', 'system'])}\n{words}")
        elif kind == 0:
            lines.append(f"{words.capitalize()}? Answer with <answer>N</answer>.")
        elif kind == 1:
            lines.append(f"<think>{words}</think><answer>{num}</answer>")
        elif kind == 2:
            lines.append(f"<think>{words}</think> <answer>{box}</answer>")
        elif kind == 3:
            lines.append(f"{words}? A. {rng.choice(_WORDS)} B. {rng.choice(_WORDS)} <answer>{opt}</answer>")
        else:
            lines.append(f"{words} {num}, {box}. {opt}: {words.upper()}")
    return lines


@functools.lru_cache(maxsize=None)
def _trained_bpe(vocab_size: int) -> tuple[str, str]:
    """(vocab json, merges json) of a BPE trained with Qwen2's pre-tokenizer; cached per process."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    # Sort the vocab by id so the result is independent of dict ordering; merges are pairs.
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return json.dumps(vocab), json.dumps(merges)


def tiny_tokenizer(vocab_size: int = 800):
    """A fresh `Qwen2Tokenizer` (byte-level BPE + Qwen special tokens + chat template).

    eos = <|im_end|> (end of an assistant turn), pad = <|endoftext|>. Named attributes
    (`image_token`, `video_token`, `audio_token`, ...) are set so processors find their pads.
    """
    from transformers import Qwen2Tokenizer

    vocab_json, merges_json = _trained_bpe(vocab_size - len(SPECIAL_TOKENS))
    vocab = json.loads(vocab_json)
    # Specials get fixed ids right after the BPE pieces, in SPECIAL_TOKENS order (as in Qwen's
    # vocabulary: <|endoftext|>, <|im_start|>, <|im_end|>, ...), whatever order transformers adds them.
    for tok_str in SPECIAL_TOKENS.values():
        vocab[tok_str] = len(vocab)
    named = {k: v for k, v in SPECIAL_TOKENS.items() if k not in ("pad_token", "eos_token", "bos_chat")}
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[tuple(m) for m in json.loads(merges_json)],
        unk_token=None,
        eos_token=SPECIAL_TOKENS["eos_token"],
        pad_token=SPECIAL_TOKENS["pad_token"],
        extra_special_tokens=named,
    )
    # <|im_start|> is special (never split, skipped on decode) but has no named slot.
    tok.add_special_tokens({"extra_special_tokens": [SPECIAL_TOKENS["bos_chat"]]},
                           replace_extra_special_tokens=False)
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"  # generate() needs left padding; collate() does its own anyway
    return tok
