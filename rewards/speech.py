"""Transcription rewards: `wer` = max(0, 1 - WER) and `cer` = max(0, 1 - CER), via jiwer.

Default normalisation (`normalize=True`), applied to both sides: lowercase, every Unicode
punctuation character replaced by a space (so "don't" -> "don t", "end." -> "end"), whitespace
collapsed. With `normalize=False` the strings go to jiwer as they are, so WER equals
`jiwer.wer(reference, hypothesis)` exactly (jiwer only strips and splits on spaces).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from rewards.core import as_bool, extract_answer, score_batch, solution_text, strip_punctuation
from rewards.registry import register


def normalize_transcript(text: str) -> str:
    """The default WER/CER normalisation.

    >>> normalize_transcript("  Hello,   World! It's me.")
    'hello world it s me'
    """
    return " ".join(strip_punctuation(text.lower()).split())


_MULTIPLE_SPACES = re.compile(r"\s\s+")


def jiwer_units(text: str, unit: str) -> list[str] | str:
    """jiwer's default transforms: words = `wer_default` (runs of 2+ whitespace -> one space,
    strip, split on " "), characters = `cer_default` (strip; every character, spaces included).

    >>> jiwer_units(" a\\tb  c ", "word"), jiwer_units(" ab c", "char")
    (['a\\tb', 'c'], 'ab c')
    """
    if unit == "char":
        return text.strip()  # a string is its own list of characters (rapidfuzz is faster on it)
    return [w for w in _MULTIPLE_SPACES.sub(" ", text).strip().split(" ") if w]


def error_rate(reference: str, hypothesis: str, unit: str = "word") -> float:
    """jiwer.wer (unit="word") or jiwer.cer (unit="char") of one pair, bit for bit.

    jiwer computes (S + D + I) / (H + S + D) from an optimal alignment, which is the Levenshtein
    distance over the reference length; rapidfuzz (jiwer's own engine) gives the distance
    without building the alignment, several times faster. An empty reference gives the number
    of inserted units, as jiwer.
    """
    from rapidfuzz.distance import Levenshtein

    ref, hyp = jiwer_units(reference, unit), jiwer_units(hypothesis, unit)
    if not ref:
        return float(len(hyp))
    return float(Levenshtein.distance(ref, hyp)) / float(len(ref))


def _transcript_one(text: str, solution: Any, *, unit: str, normalize: bool) -> float:
    hypothesis, reference = extract_answer(text), solution_text(solution)
    if normalize:
        hypothesis, reference = normalize_transcript(hypothesis), normalize_transcript(reference)
    if not hypothesis.strip():
        return 0.0  # an empty answer never earns credit, even for an empty reference
    # jiwer scores an empty reference as "number of inserted words", which is >= 1 here.
    return max(0.0, 1.0 - error_rate(reference, hypothesis, unit))


@register("wer")
def wer(completions: list, solution: list, *, normalize: bool = True, tasks: Any = None,
        **fields: Any) -> list[float | None]:
    """max(0, 1 - word error rate) of the answer against the reference transcript.

    >>> wer(["<answer>Hello world!</answer>", "<answer>hello there world</answer>"],
    ...     ["hello world", "hello world"])
    [1.0, 0.5]
    """
    return score_batch(_transcript_one, completions, solution, fields, tasks=tasks, unit="word",
                       normalize=as_bool(normalize))


@register("cer")
def cer(completions: list, solution: list, *, normalize: bool = True, tasks: Any = None,
        **fields: Any) -> list[float | None]:
    """max(0, 1 - character error rate); spaces count as characters, as in `jiwer.cer`.

    >>> cer(["<answer>kitten</answer>"], ["sitting"])
    [0.5714285714285714]
    """
    return score_batch(_transcript_one, completions, solution, fields, tasks=tasks, unit="char",
                       normalize=as_bool(normalize))


def corpus_error_rate(hypotheses: Sequence[str], references: Sequence[Any], unit: str = "word",
                      normalize: bool = True) -> float:
    """Metric: corpus WER (or CER with unit="char"): total edits / total reference length, as
    `jiwer.wer(references, hypotheses)` on the (normalised) lists.

    >>> corpus_error_rate(["<answer>hello world</answer>", "a b"], ["hello world", "a c d e"])
    0.5
    """
    import jiwer

    hyps = [extract_answer(h) for h in hypotheses]
    refs = [solution_text(r) for r in references]
    if normalize:
        hyps = [normalize_transcript(h) for h in hyps]
        refs = [normalize_transcript(r) for r in refs]
    if not refs:
        return 0.0
    measure = jiwer.wer if unit == "word" else jiwer.cer
    return float(measure(refs, hyps))
