"""What kind of reasoning a completion shows, for think / no-think training (TON, No-Thinking-
CLS-RL): a non-empty think block, an empty one ("<think>\\n</think>", TON's skip), or none."""
from __future__ import annotations

from typing import Any

from rewards.core import completion_text, score_batch
from rewards.registry import register

THINK_KINDS = ("think", "empty", "none")


def think_kind(text: Any) -> str:
    """"think" for a non-empty `<think>...</think>` before the answer, "empty" for an empty one,
    "none" without a closed think block.

    >>> think_kind("<think>a</think><answer>1</answer>"), think_kind("<think> </think><answer>1</answer>")
    ('think', 'empty')
    >>> think_kind("<answer>1</answer>"), think_kind("<think>unclosed <answer>1</answer>")
    ('none', 'none')
    """
    text = completion_text(text)
    start = text.find("<think>")
    end = text.find("</think>", start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return "none"
    return "think" if text[start + len("<think>"):end].strip() else "empty"


def think_shares(completions: list) -> dict[str, float]:
    """{kind: share of completions} over THINK_KINDS (0.0 each for an empty list).

    >>> think_shares(["<think>a</think>x", "<answer>1</answer>", "<answer>2</answer>", "<think></think>"])
    {'think': 0.25, 'empty': 0.25, 'none': 0.5}
    """
    kinds = [think_kind(c) for c in completions]
    return {k: kinds.count(k) / len(kinds) if kinds else 0.0 for k in THINK_KINDS}


def _think_format_one(text: str, _solution: Any, *, think_mode: Any) -> float:
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return 0.0
    head, _, rest = text.partition("<answer>")
    answer, _, tail = rest.partition("</answer>")
    if not answer.strip() or tail.strip():
        return 0.0
    tags = head.count("<think>") + head.count("</think>") + answer.count("<think>")
    kind = think_kind(head)
    shaped = (kind == "none" and tags == 0 and not head.strip()) or \
             (kind != "none" and tags == 2 and head.strip().startswith("<think>")
              and head.strip().endswith("</think>"))
    if not shaped:
        return 0.0
    if think_mode == "think":
        return 1.0 if kind == "think" else 0.0
    if think_mode == "no_think":
        return 1.0 if kind != "think" else 0.0  # an empty think block is TON's "skip"
    return 1.0  # no mode asked: either shape


@register("think_format")
def think_format(completions: list, solution: list | None = None, *, tasks: Any = None,
                 **fields: Any) -> list[float | None]:
    """Format reward for hybrid think / no-think training: the `think_mode` field of a sample
    (set by data.think_hybrid) says what it was asked. "think": one non-empty think block then one
    non-empty answer block, nothing else. "no_think": the answer block alone (an empty think
    block before it also counts, as TON's skip). No field: either shape.

    >>> think_format(["<think>a</think><answer>1</answer>", "<answer>1</answer>",
    ...               "<think>a</think><answer>1</answer>", "<think></think><answer>1</answer>",
    ...               "so <answer>1</answer>"], [None] * 5,
    ...              think_mode=["think", "think", "no_think", "no_think", None])
    [1.0, 0.0, 0.0, 1.0, 0.0]
    """
    return score_batch(_think_format_one, completions, solution, fields, tasks=tasks,
                       needs=("think_mode",), solution_required=False)
