"""Verifiable rewards for RL on language and multimodal models: plain functions, no trainer.

    from rewards import get_reward
    get_reward("iou")(completions, solution, image_size=[...])  # -> list[float | None]

Every reward has the signature `fn(completions: list[str], solution: list, **fields)`; fields are
per-sample lists (image_size, duration, options, task, ...), unknown fields are ignored, and
None means "not applicable to this sample". Parameters are keyword arguments with defaults (bind
them with functools.partial); `REWARDS.params(name)` lists them. This package imports nothing
from `mmrl`.
"""
from rewards import (choice, counting, detection, env_info, format, label_free, looked_at,
                     numeric, order, sets, speech, temporal, text, thinking, tool_use)
from rewards.core import combine, extract_answer
from rewards.metrics import (corpus_bleu, corpus_cer, corpus_error_rate, corpus_wer, map50,
                             mean_average_precision, mean_relative_accuracy,
                             temporal_grounding_metrics)
from rewards.registry import REWARDS, RewardRegistry, get_reward, register

__all__ = [
    "REWARDS", "RewardRegistry", "get_reward", "register", "extract_answer", "combine",
    "corpus_bleu", "corpus_error_rate", "corpus_wer", "corpus_cer", "mean_average_precision",
    "map50", "mean_relative_accuracy", "temporal_grounding_metrics",
    "choice", "counting", "detection", "env_info", "format", "label_free", "looked_at", "numeric", "order", "sets", "speech", "temporal", "text", "thinking",
    "tool_use",
]
