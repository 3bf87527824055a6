"""Set-valued answers: `jaccard` (|P ∩ G| / |P ∪ G|), e.g. multi-label classification."""
from __future__ import annotations

import re
from typing import Any

from rewards.core import (NOT_JSON, extract_answer, load_json, normalize_text, score_batch,
                          solution_text)
from rewards.registry import register

_SEPARATORS = re.compile(r"[,;\n]")
_ITEM_EDGES = "\"'`[](){} "


def _item(value: Any) -> str:
    return normalize_text(str(value)).strip(_ITEM_EDGES).strip()


def parse_set(value: Any) -> set[str]:
    """A set of normalised items from a list, a JSON list, or text split on `,` `;` or newlines.

    >>> sorted(parse_set('["Cat", " dog "]')), sorted(parse_set("cat; Dog\\nbird"))
    (['cat', 'dog'], ['bird', 'cat', 'dog'])
    """
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = load_json(text)  # truncated or not JSON: split the text instead
        if value is NOT_JSON or isinstance(value, str):
            value = _SEPARATORS.split(text)
    if isinstance(value, dict):
        value = list(value)
    if not isinstance(value, (list, tuple, set, frozenset)):
        value = [value]
    return {item for item in map(_item, value) if item}


def _jaccard_one(text: str, solution: Any, threshold: float | None = None) -> float:
    answer = extract_answer(text)
    if not answer:
        return 0.0
    pred = parse_set(answer)
    is_collection = isinstance(solution, (list, tuple, set))
    gold = parse_set(solution if is_collection else solution_text(solution))
    if not pred and not gold:
        return 1.0  # "[]" for "nothing applies" is right; an empty answer string returned 0 above
    overlap = len(pred & gold) / len(pred | gold)
    return overlap if threshold is None else float(overlap >= threshold)


@register("jaccard")
def jaccard(completions: list, solution: list, *, threshold: float | None = None,
            tasks: Any = None, **fields: Any) -> list[float | None]:
    """Set overlap |P ∩ G| / |P ∪ G| of answer items and solution items (case/space-normalised).

    Items are a JSON list or text split on commas, semicolons or newlines. Listing every class is
    penalised by the union, so it never earns full credit. `threshold` makes it 1/0 (1.0: the
    exact set only, Visual-RFT's classification reward), so a hedge that names one extra class
    earns nothing instead of partial credit.

    >>> jaccard(["<answer>cat, dog</answer>", "<answer>[\\"Dog\\"]</answer>",
    ...          "<answer>cat, dog, bird, fish</answer>"], [["cat", "dog"], "dog; cat", "cat"])
    [1.0, 0.5, 0.25]
    >>> jaccard(["<answer>cat, dog</answer>", "<answer>cat</answer>"], ["cat, dog"] * 2, threshold=1.0)
    [1.0, 0.0]
    """
    return score_batch(_jaccard_one, completions, solution, fields, tasks=tasks,
                       threshold=threshold)
