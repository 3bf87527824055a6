"""Free-text rewards: `bleu` (sacrebleu sentence BLEU) and `rouge_l` (LCS F1), plus corpus BLEU."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Sequence

from rewards.core import extract_answer, score_batch, solution_text
from rewards.registry import register


@lru_cache(maxsize=1)
def _sentence_bleu_metric():
    # The object `sacrebleu.sentence_bleu` builds on every call, built once: same defaults
    # (13a tokenizer, exp smoothing, effective order), same scores, less overhead per sample.
    from sacrebleu.metrics import BLEU

    return BLEU(effective_order=True)


def _references(solution: Any) -> list[str]:
    if isinstance(solution, (list, tuple)):
        return [solution_text(s) for s in solution if s is not None][:16]
    return [solution_text(solution)]


def _bleu_one(text: str, solution: Any) -> float:
    hypothesis = extract_answer(text)
    references = [r for r in _references(solution) if r]
    if not hypothesis or not references:
        return 0.0
    score = _sentence_bleu_metric().sentence_score(hypothesis, references).score / 100.0
    return min(score, 1.0)  # sacrebleu's perfect score can be 100.00000000000004


@register("bleu")
def bleu(completions: list, solution: list, *, tasks: Any = None,
         **fields: Any) -> list[float | None]:
    """Sentence BLEU in [0, 1]: `sacrebleu.sentence_bleu(answer, refs).score / 100`, defaults.

    A list solution is several references.

    >>> bleu(["<answer>the cat sat on the mat</answer>", "<answer>a dog</answer>"],
    ...      ["the cat sat on the mat", "the cat sat on the mat"])
    [1.0, 0.0]
    """
    return score_batch(_bleu_one, completions, solution, fields, tasks=tasks)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[Any]) -> float:
    """Metric: corpus BLEU in [0, 1] (`sacrebleu.corpus_bleu`), answers extracted from tags.

    `references[i]` is a string or a list of strings (all samples need the same number).

    >>> corpus_bleu(["<answer>the cat sat on the mat</answer>"], ["the cat sat on the mat"])
    1.0
    """
    import sacrebleu

    hyps = [extract_answer(h) for h in hypotheses]
    refs = [_references(r) for r in references]
    n_refs = max((len(r) for r in refs), default=1)
    # sacrebleu wants one stream per reference position; pad short lists with empty references.
    streams = [[r[k] if k < len(r) else "" for r in refs] for k in range(n_refs)]
    return min(sacrebleu.corpus_bleu(hyps, streams).score / 100.0, 1.0)


# Latin-like words as \w runs; CJK characters one token each (they are not space-separated).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


def rouge_tokens(text: str) -> list[str]:
    """Lowercased word tokens (CJK: one character each), punctuation dropped.

    >>> rouge_tokens("The cat, the HAT!"), rouge_tokens("我爱猫")
    (['the', 'cat', 'the', 'hat'], ['我', '爱', '猫'])
    """
    return _TOKEN.findall(text.lower())


def lcs_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common subsequence, bit-parallel (Allison-Dix / Hyyrö).

    Each row of the classic DP is one Python big-int operation, so 1000x1000 tokens cost 1000
    big-int steps instead of a million Python steps.

    >>> lcs_length("ABCBDAB", "BDCABA")
    4
    """
    if not a or not b:
        return 0
    masks: dict[Any, int] = {}
    for i, token in enumerate(a):
        masks[token] = masks.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for token in b:
        matched = row & masks.get(token, 0)
        row = ((row + matched) | (row - matched)) & full
    return len(a) - row.bit_count()


def rouge_l_f1(hypothesis: str, reference: str) -> float:
    """ROUGE-L F1 (beta = 1) of two texts over `rouge_tokens`."""
    hyp, ref = rouge_tokens(hypothesis), rouge_tokens(reference)
    lcs = lcs_length(hyp, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(hyp), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def _rouge_one(text: str, solution: Any) -> float:
    hypothesis = extract_answer(text)
    if not hypothesis:
        return 0.0
    return max((rouge_l_f1(hypothesis, r) for r in _references(solution) if r), default=0.0)


@register("rouge_l")
def rouge_l(completions: list, solution: list, *, tasks: Any = None,
            **fields: Any) -> list[float | None]:
    """ROUGE-L F1 between the answer and the solution (best over a list of references).

    Tokens: lowercase `\\w` runs, CJK characters one each; no stemming.

    >>> rouge_l(["<answer>the cat was under the bed</answer>"], ["the cat was found under the bed"])
    [0.923076923076923]
    """
    return score_batch(_rouge_one, completions, solution, fields, tasks=tasks)
