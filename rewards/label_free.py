"""Label-free rewards (TTRL, MM-UPT): the group's majority answer stands in for the label.

Each prompt is sampled G times; the most frequent answer among its completions becomes the
pseudo-label and a completion scores 1.0 when its answer equals it. Answers are compared after
`extract_answer`, as numbers when both parse as numbers ("3" == "3.0"), else as normalised text.
The trainer passes the group of every row as the `group_id` field.

When too few samples agree (share of the group giving the majority answer < `min_agreement`)
the vote is noise, not a label: the whole group scores None (not applicable: with a single
reward the total is 0 for every row, so the group carries no advantage) or 0.0 with
`below="zero"`. Empty answers never vote.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

from rewards.core import (completion_text, extract_answer, field_column, normalize_text, plain,
                          solution_text, to_float)
from rewards.registry import register


def answer_key(text: Any) -> str | None:
    """The comparable form of a completion's answer: a number as its float repr, else normalised
    text; None for an empty answer.

    >>> answer_key("<answer> 3.0 </answer>"), answer_key("<answer>Paris.</answer>"), answer_key("")
    ('3.0', 'paris', None)
    """
    answer = extract_answer(completion_text(text))
    if not answer:
        return None
    value = to_float(answer)
    return repr(value) if value is not None else normalize_text(answer) or None


def _key(group: Any) -> str:
    """Any group id (int, str, numpy scalar, even a list) as a hashable key."""
    return repr(plain(group))


def group_majorities(completions: list, group_id: list) -> dict[Any, tuple[str | None, float]]:
    """{repr(group id): (majority answer key or None, share of the group's rows giving it)}.

    Ties go to the answer seen first in the group (deterministic). The share counts every row of
    the group in the denominator, empty answers included.
    """
    keys: dict[Any, list] = {}
    for text, g in zip(completions, group_id):
        keys.setdefault(_key(g), []).append(answer_key(text))
    out = {}
    for g, ks in keys.items():
        votes = Counter(k for k in ks if k is not None)
        if not votes:
            out[g] = (None, 0.0)
            continue
        best = max(votes.values())
        winner = next(k for k in ks if k is not None and votes[k] == best)  # first seen wins ties
        out[g] = (winner, best / len(ks))
    return out


@register("majority_vote")
def majority_vote(completions: list, solution: list, *, min_agreement: float = 0.0,
                  below: str = "none", tasks: Any = None, **fields: Any) -> list[float | None]:
    """1.0 when the answer equals its group's majority answer, else 0.0; the solution is ignored.

    Needs the `group_id` field (the trainer passes it); a row without one is a group of its own
    (its answer agrees with itself: 1.0 for a non-empty answer; warned once). Groups whose majority share is below
    `min_agreement` score None (`below="none"`) or 0.0 (`below="zero"`).

    >>> majority_vote(["<answer>3</answer>", "<answer>3.0</answer>", "<answer>4</answer>",
    ...                "<answer>a</answer>", "<answer>b</answer>"], [None] * 5,
    ...               group_id=[0, 0, 0, 1, 1], min_agreement=0.6)
    [1.0, 1.0, 0.0, None, None]
    """
    if below not in ("none", "zero"):
        raise ValueError(f"majority_vote: below must be 'none' or 'zero'; got {below!r}")
    n = len(completions)
    groups = field_column(fields, "group_id", n)
    warned = fields.get("warned")  # the caller's once-per-run set (no module state)
    if any(g is None for g in groups) and (warned is None or "majority_vote" not in warned):
        if warned is not None:
            warned.add("majority_vote")
        warnings.warn("majority_vote needs the `group_id` field (one group per prompt; the mmrl "
                      "trainer passes it): each row without one is a group of its own",
                      RuntimeWarning, stacklevel=2)
    groups = [("row", i) if g is None else g for i, g in enumerate(groups)]
    task_col = field_column(fields, "task", n)
    allowed = None if tasks is None else ({tasks} if isinstance(tasks, str) else set(tasks))
    majority = group_majorities(completions, groups)
    out: list[float | None] = []
    for text, g, task in zip(completions, groups, task_col):
        winner, share = majority[_key(g)]
        if allowed is not None and task not in allowed:
            out.append(None)
        elif winner is None or share < min_agreement:
            out.append(None if below == "none" else 0.0)
        else:
            out.append(1.0 if answer_key(text) == winner else 0.0)
    return out


def majority_error(completions: list, solution: list, group_id: list) -> tuple[int, int]:
    """(groups whose solution is known, those among them whose majority answer is not the
    solution): how often the pseudo-label is wrong where a real label exists. A group with no
    majority (every answer empty) counts as wrong.

    >>> majority_error(["<answer>3</answer>", "<answer>3</answer>", "<answer>5</answer>",
    ...                 "<answer>6</answer>"], ["3", "3", "4", "4"], [0, 0, 1, 1])
    (2, 1)
    """
    majority = group_majorities(completions, group_id)
    labels: dict[Any, str | None] = {}
    for sol, g in zip(solution, group_id):
        text = solution_text(plain(sol)) if sol is not None else ""
        labels.setdefault(_key(g), answer_key(f"<answer>{text}</answer>") if text else None)
    known = [g for g, label in labels.items() if label is not None]
    wrong = sum(1 for g in known if majority[g][0] != labels[g])
    return len(known), wrong
