"""`accuracy`: exact match, multiple-choice letters, numbers with a tolerance, and math-verify."""
from __future__ import annotations

import re
import string
import threading
from functools import lru_cache
from typing import Any

from rewards.core import (NOT_JSON, answer_number, extract_answer, load_json, normalize_text,
                          score_batch, solution_text, to_float)
from rewards.registry import register

MODES = ("auto", "exact", "choice", "numeric", "math")

# Whole answer is one letter: "B", "(b)", "[C]", "D.".
_LETTER_ONLY = re.compile(r"[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[.:]?")
# Answer starts with a labelled option: "B. dog", "(B) dog", "C: 3 apples". Needs punctuation after
# the letter, so that "A dog" (an article) is not read as option A.
_LETTER_LEAD = re.compile(r"[\(\[]?([A-Z])[\)\].:]+(?:\s|$)")
# The keyword in any case ("Option B", "THE ANSWER IS B"); a lower-case letter counts only where
# nothing follows it but a bracket or punctuation ("option b", "the answer is (c)."), so that
# "the answer is a dog" does not read as option A.
_LETTER_PHRASE = re.compile(r"\b(?i:answer|option|choice)\s*(?i:is|:)?\s*[\(\[]?"
                            r"([A-Z]|[a-z](?=[\)\]]?\s*[.,;:!?]?\s*$))\b")
_LETTER_PAREN = re.compile(r"\(([A-Z])\)")
_OPTION_PREFIX = re.compile(r"\s*[\(\[]?([A-Z])[\)\].:]\s*")


def parse_options(options: Any) -> dict[str, str]:
    """Options as {letter: normalised text} from a list ("A. cat" or bare "cat"), dict or JSON."""
    if isinstance(options, str):
        parsed = load_json(options)
        options = (parsed if parsed is not NOT_JSON
                   else [line for line in options.splitlines() if line.strip()])
    if isinstance(options, dict):
        return {str(k).strip().upper(): normalize_text(str(v)) for k, v in options.items()
                if len(str(k).strip()) == 1}
    if not isinstance(options, (list, tuple)):
        return {}
    out = {}
    for index, option in enumerate(options[:26]):
        text = str(option)
        prefix = _OPTION_PREFIX.match(text)
        letter = prefix.group(1) if prefix else string.ascii_uppercase[index]
        out[letter] = normalize_text(text[prefix.end():] if prefix else text)
    return out


def _letter_from_text(text: str, options: dict[str, str]) -> str | None:
    match = _LETTER_ONLY.fullmatch(text)
    if match:
        return match.group(1).upper()
    match = _LETTER_LEAD.match(text)
    if match:
        return match.group(1)
    normalized = normalize_text(text)
    for letter, option_text in options.items():
        if option_text and normalized == option_text:
            return letter
    # Free text: accept a letter only when it is unambiguous, so that "A or B" earns nothing.
    for pattern in (_LETTER_PHRASE, _LETTER_PAREN):
        letters = {letter.upper() for letter in pattern.findall(text)}
        if len(letters) == 1:
            return letters.pop()
    return None


def _choice(answer: str, gold: str, options: dict[str, str]) -> float | None:
    gold_letter = _letter_from_text(gold, options)
    if gold_letter is None:
        return None  # not a choice question after all: the caller falls back to exact match
    return 1.0 if _letter_from_text(answer, options) == gold_letter else 0.0


def _numeric(answer: str, gold: str, tol: float) -> float | None:
    target = to_float(gold)
    if target is None:
        return None
    value = answer_number(answer)
    if value is None:
        return 0.0
    # Relative tolerance for large values, absolute for |target| < 1 (so that 0 is reachable).
    return 1.0 if abs(value - target) <= tol * max(1.0, abs(target)) else 0.0


def _math_timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which raises outside the main thread; rewards run
    # in worker threads in some trainers, so there the timeout is dropped instead.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _math_parse(text: str, timeout: int | None) -> list:
    from math_verify import parse

    return parse(text, parsing_timeout=timeout) or parse(f"${text}$", parsing_timeout=timeout)


@lru_cache(maxsize=4096)
def _math_parse_gold(gold: str, timeout: int | None) -> tuple:
    # GRPO scores a group of completions against one solution: parse it once per group.
    return tuple(_math_parse(gold, timeout))


def _math(answer: str, gold: str) -> float | None:
    from math_verify import verify

    if answer.strip() == gold.strip():
        return 1.0  # identical strings need no sympy (math-verify takes ~1-10 ms a call)
    timeout = _math_timeout()
    gold_parsed = _math_parse_gold(gold, timeout)
    if not gold_parsed:
        return None
    pred_parsed = _math_parse(answer, timeout)
    return 1.0 if pred_parsed and verify(list(gold_parsed), pred_parsed,
                                         timeout_seconds=timeout) else 0.0


def _auto_mode(gold: str, options: dict[str, str]) -> str:
    if options or re.fullmatch(r"[\(\[]?[A-Z][\)\]]?\.?", gold):
        return "choice"
    if to_float(gold) is not None:
        return "numeric"
    if "\\" in gold or "$" in gold:  # LaTeX: exact string match would reject equal expressions
        return "math"
    return "exact"


def _accuracy_one(text: str, solution: Any, *, options: Any, mode: str,
                  tol: float) -> float | None:
    answer = extract_answer(text)
    golds = solution if isinstance(solution, (list, tuple)) else [solution]
    parsed_options = parse_options(options) if options is not None else {}
    lenient = mode in ("auto", "exact")  # falls back to string equality, so always scores
    best = 0.0 if lenient else None
    for gold in (solution_text(g) for g in golds[:32]):
        if not gold:
            continue
        chosen = _auto_mode(gold, parsed_options) if mode == "auto" else mode
        score = None
        if not answer:
            score = 0.0 if lenient or _mode_reads(chosen, gold, parsed_options) else None
        elif chosen == "choice":
            score = _choice(answer, gold, parsed_options)
        elif chosen == "numeric":
            score = _numeric(answer, gold, tol)
        elif chosen == "math":
            score = _math(answer, gold)
        if score is None and lenient:  # auto's choice did not fit this gold
            score = 1.0 if normalize_text(answer) == normalize_text(gold) else 0.0
        if score is not None:  # None: a mode named in the config cannot read this gold answer
            best = score if best is None else max(best, score)
    return best


def _mode_reads(mode: str, gold: str, options: dict[str, str]) -> bool:
    """Whether an explicitly named mode can read this gold answer at all."""
    if mode == "choice":
        return _letter_from_text(gold, options) is not None
    if mode == "numeric":
        return to_float(gold) is not None
    return bool(_math_parse_gold(gold, _math_timeout()))


@register("accuracy")
def accuracy(completions: list, solution: list, *, mode: str = "auto", tol: float = 1e-6,
             tasks: Any = None, **fields: Any) -> list[float | None]:
    """1.0 when the extracted answer equals the solution, else 0.0; `mode` picks the comparison.

    Modes: `exact` (after lowercasing, whitespace collapsing and stripping trailing punctuation),
    `choice` (option letters: "B", "(B)", "B. dog", "the answer is B"; with the `options` field the
    option text also counts), `numeric` (the answer's number, or else its last number, within
    |pred - gold| <= tol * max(1, |gold|)), `math` (math-verify). `auto` picks `choice` for a
    single-letter solution or when `options` are given, `numeric` when the solution is a number,
    `math` when it contains LaTeX (a backslash or `$`), else `exact`. A solution wrapped in
    `<answer>` tags is unwrapped; a list solution means "any of these". A mode named explicitly
    returns None for a gold answer it cannot read (`choice`: no letter; `numeric`: no number;
    `math`: no expression), so `reward/<key>/scored_frac` shows the mismatch instead of a 0.

    >>> accuracy(["<answer>B</answer>", "<answer>option b</answer>"], ["12", "B"], mode="choice")
    [None, 1.0]
    >>> accuracy(["<answer>Paris.</answer>", "<answer>(B)</answer>", "<answer>3.0</answer>"],
    ...          ["paris", "B", "3"])
    [1.0, 1.0, 1.0]
    >>> accuracy(["<answer>dog</answer>"], ["B"], options=[["A. cat", "B. dog"]])
    [1.0]
    >>> accuracy(["<answer>$\\\\frac{1}{2}$</answer>"], ["0.5"], mode="math")
    [1.0]
    """
    if mode not in MODES:
        raise ValueError(f"accuracy: mode must be one of {MODES}, got {mode!r}")
    return score_batch(_accuracy_one, completions, solution, fields, tasks=tasks,
                       needs=("options",), mode=mode, tol=float(tol))
