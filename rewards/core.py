"""Shared pieces of every reward: answer extraction, text/number parsing, the per-sample loop.

Rewards are plain functions `fn(completions, solution, **fields) -> list[float | None]`. The loop
in `score_batch` is where the contract is enforced once for all of them: `None` for samples the
reward does not apply to, finite floats only, unknown fields ignored, and garbage never raising.
"""
from __future__ import annotations

import json
import math
import re
import sys
import unicodedata
import warnings
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAG_START = ANSWER_OPEN[:-1]  # "<answer": an opening tag, even one mangled after its name

# Decimal numbers only: no "nan"/"inf" on purpose (a model must not answer "inf" and match a
# tolerance). Thousands commas are accepted in a whole answer ("1,024") but not when scanning text,
# where "[100,200,300,400]" must stay four numbers.
_NUMBER_FULL = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")
_FRACTION_FULL = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
_NUMBER_SCAN = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_NUMBER_SCAN_GROUPED = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_TRAILING_PUNCT = ".,;:!?。，；：！？"


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the last message of a chat (TRL conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", "")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in content
                           if isinstance(p, dict) and isinstance(p.get("text"), str))
        return content if isinstance(content, str) else ""
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return ""


def extract_answer(text: Any) -> str:
    """The stripped text of the last `<answer>...</answer>` block, else the whole text stripped
    (the anchors' fallback for a model that answers plainly), but "" when the text holds a tag
    of a block that never closes: an answer cut at the token budget, or tags broken in sampling.
    Scoring those as plain text paid label words sprayed into garbage (a tiny classifier learned
    to write "<answer>circle, trian>sirc, square, s tri" and never close the tag).

    Blocks are matched like `re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)` (leftmost,
    shortest, non-overlapping) but with `str.find`, so adversarial inputs stay linear-time.

    >>> extract_answer("<think>hmm</think><answer> B </answer>")
    'B'
    >>> extract_answer("<answer>1</answer> then <answer>2</answer>")
    '2'
    >>> extract_answer("  just text ")
    'just text'
    """
    text = completion_text(text)
    last, pos = None, 0
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            break
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break
        last, pos = text[start + len(ANSWER_OPEN):end], end + len(ANSWER_CLOSE)
    if last is None and (_TAG_START in text or ANSWER_CLOSE[:-1] in text):
        return ""
    return (text if last is None else last).strip()


def solution_text(solution: Any) -> str:
    """A solution as text; R1-V style solutions wrapped in `<answer>` tags are unwrapped."""
    if solution is None:
        return ""
    if isinstance(solution, float) and solution.is_integer() and abs(solution) < 1e15:
        solution = int(solution)  # 3.0 from a parquet column means "3"
    text = solution if isinstance(solution, str) else str(solution)
    return extract_answer(text)


def normalize_text(text: str) -> str:
    """Lowercase, collapse whitespace, strip, drop trailing punctuation ("Paris." == "paris")."""
    text = " ".join(text.lower().split())
    return text.rstrip(_TRAILING_PUNCT).strip()


@lru_cache(maxsize=1)
def _punctuation_table() -> dict[int, str]:
    # Built once (~0.2 s over all code points) so that stripping is one C-level str.translate.
    return {cp: " " for cp in range(sys.maxunicode + 1)
            if unicodedata.category(chr(cp)).startswith("P")}


def strip_punctuation(text: str) -> str:
    """Replace every Unicode punctuation character (category P*) with a space.

    >>> strip_punctuation("it's «fine»!")
    'it s  fine  '
    """
    return text.translate(_punctuation_table())


_NOT_JSON = object()


def load_json(text: str) -> Any:
    """`json.loads`, or the sentinel `NOT_JSON` for invalid, truncated or absurdly nested text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


NOT_JSON = _NOT_JSON


def as_bool(value: Any) -> bool:
    """A boolean parameter that may arrive as a string from YAML or the CLI ("false" -> False)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "none")
    return bool(value)


def to_float(value: Any) -> float | None:
    """A finite float from a number or a number-like string ("1,024", "3/4", "50%"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            out = float(value)
        except OverflowError:  # ints beyond float range
            return None
        return out if math.isfinite(out) else None
    if not isinstance(value, str):
        return None
    text = value.strip().rstrip(".").strip()
    if text.startswith("$") and text.endswith("$") and len(text) > 1:
        text = text.strip("$").strip()
    scale = 1.0
    if text.endswith("%"):
        text, scale = text[:-1].strip(), 0.01
    if _NUMBER_FULL.fullmatch(text):
        out = float(text.replace(",", "")) * scale
        return out if math.isfinite(out) else None
    frac = _FRACTION_FULL.fullmatch(text)
    if frac:
        num, den = float(frac.group(1)), float(frac.group(2))
        out = num / den * scale if den != 0 else math.nan
        return out if math.isfinite(out) else None
    return None


def find_numbers(text: str, thousands: bool = False) -> list[float]:
    """Every finite decimal number in `text`, in order ("x=3, y=-4.5" -> [3.0, -4.5]).

    With `thousands`, "1,024" is one number (in prose); without, "[100,200]" is two (in lists).
    """
    out = []
    for match in (_NUMBER_SCAN_GROUPED if thousands else _NUMBER_SCAN).finditer(text):
        value = float(match.group().replace(",", ""))
        if math.isfinite(value):
            out.append(value)
    return out


def answer_number(answer: str) -> float | None:
    """The number an answer states: the whole answer if it is one, else its last number."""
    value = to_float(answer)
    if value is not None:
        return value
    numbers = find_numbers(answer, thousands=True)
    return numbers[-1] if numbers else None


def field_column(fields: dict, name: str, n: int) -> list:
    """Per-sample values of field `name`, padded with None (missing field or a short column)."""
    column = fields.get(name)
    if column is None or isinstance(column, (str, bytes)) or not hasattr(column, "__len__"):
        return [None] * n
    values = list(column)[:n]
    return values + [None] * (n - len(values))


def plain(value: Any) -> Any:
    """numpy / torch values (from parquet or datasets columns) as plain Python lists and numbers."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        try:
            return value.tolist()
        except (TypeError, ValueError):
            return value
    return value


def _finite_or_none(score: Any, name: str, strict: bool) -> float | None:
    if score is None:
        return None
    score = float(score)
    if not math.isfinite(score):
        if strict:
            raise ValueError(f"reward {name} produced a non-finite score {score}")
        return 0.0
    return score + 0.0  # turn -0.0 into 0.0


def score_batch(score_one: Callable[..., float | None], completions: Sequence, solution: Sequence,
                fields: dict, *, needs: Iterable[str] = (), tasks: Any = None,
                solution_required: bool = True, **params: Any) -> list[float | None]:
    """Run `score_one(answer_source, solution, **needed_fields, **params)` over a batch.

    `score_one` receives the completion text (not the extracted answer: format-style rewards need
    the whole text) and per-sample values of the fields in `needs`. A sample scores None when its
    `task` is not in `tasks` (if given) or its solution is None (if the reward needs one).

    Two call options reach every reward through its `**fields` (they are not sample columns):
    `strict=True` raises where a sample would otherwise score 0.0 (a crash or a non-finite score;
    tests use it so a bug surfaces), and `warned`, a set the caller keeps, limits the warning about
    a failing reward to once per name in that set (without one, every failure warns). In training a
    crash after hours of rollouts costs more than one mis-scored sample, so the default is lenient.
    """
    strict, warned = bool(fields.get("strict", False)), fields.get("warned")
    completions = list(completions) if completions is not None else []
    n = len(completions)
    if isinstance(solution, (list, tuple)) or (
            hasattr(solution, "__len__") and not isinstance(solution, (str, bytes, dict))):
        solutions = list(solution)[:n]
    else:
        solutions = [solution] * n  # one solution (or None) for the whole batch
    solutions += [None] * (n - len(solutions))
    columns = {name: field_column(fields, name, n) for name in needs}
    task_col = field_column(fields, "task", n)
    allowed = None if tasks is None else ({tasks} if isinstance(tasks, str) else set(tasks))
    name = getattr(score_one, "__name__", "reward")
    out: list[float | None] = []
    for i in range(n):
        if allowed is not None and task_col[i] not in allowed:
            out.append(None)
            continue
        if solution_required and solutions[i] is None:
            out.append(None)
            continue
        kwargs = {key: plain(col[i]) for key, col in columns.items()}
        try:
            score = score_one(completion_text(completions[i]), plain(solutions[i]), **kwargs,
                              **params)
            out.append(_finite_or_none(score, name, strict))
        except Exception as exc:  # noqa: BLE001 - garbage must never stop a training run
            if strict:
                raise
            if warned is None or name not in warned:
                if warned is not None:
                    warned.add(name)
                warnings.warn(f"reward {name} failed on a sample and scored it 0.0: {exc!r}",
                              RuntimeWarning, stacklevel=2)
            out.append(0.0)
    return out


def combine(scores_by_name: dict[str, Sequence[float | None]],
            weights: dict[str, float]) -> list[float]:
    """Weighted sum of reward columns; a None (not applicable) contributes 0 to the total.

    Names missing from `weights` weigh 1.0. All columns must have the same length.

    >>> combine({"accuracy": [1.0, 0.0, None], "format": [1.0, None, 1.0]},
    ...         {"accuracy": 1.0, "format": 0.5})
    [1.5, 0.0, 0.5]
    """
    lengths = {name: len(col) for name, col in scores_by_name.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"reward columns differ in length: {lengths}")
    n = next(iter(lengths.values()), 0)
    total = [0.0] * n
    for name, column in scores_by_name.items():
        weight = float(weights.get(name, 1.0))
        for i, score in enumerate(column):
            if score is not None:
                total[i] += weight * float(score)
    return total
