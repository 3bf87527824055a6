"""Dataset-level metrics for evaluation (not rewards): one import place for `mmrl eval`.

    corpus_bleu(hyps, refs)                     sacrebleu corpus BLEU in [0, 1]
    corpus_error_rate(hyps, refs, unit="word")  corpus WER (unit="char": CER), as jiwer
    mean_average_precision(preds, gts, 0.5)     COCO-style mAP@0.5 (pycocotools AP50)
    temporal_grounding_metrics(preds, gts)      R1@{0.3,0.5,0.7} and mIoU
    mean_relative_accuracy(preds, targets)      VSI-Bench MRA

Predictions may be raw completions: answers are extracted from `<answer>` tags first.
"""
from typing import Any, Sequence

from rewards.detection import mean_average_precision
from rewards.numeric import mean_relative_accuracy
from rewards.speech import corpus_error_rate
from rewards.temporal import temporal_grounding_metrics
from rewards.text import corpus_bleu


def corpus_wer(hypotheses: Sequence[str], references: Sequence[Any], normalize: bool = True
               ) -> float:
    """Corpus WER (total word edits / total reference words)."""
    return corpus_error_rate(hypotheses, references, unit="word", normalize=normalize)


def corpus_cer(hypotheses: Sequence[str], references: Sequence[Any], normalize: bool = True
               ) -> float:
    """Corpus CER (total character edits / total reference characters)."""
    return corpus_error_rate(hypotheses, references, unit="char", normalize=normalize)


def map50(predictions: Sequence[Any], ground_truths: Sequence[Any]) -> float:
    """mAP@0.5, as pycocotools' AP50."""
    return mean_average_precision(predictions, ground_truths, iou_threshold=0.5)


__all__ = ["corpus_bleu", "corpus_error_rate", "corpus_wer", "corpus_cer",
           "mean_average_precision", "map50", "mean_relative_accuracy",
           "temporal_grounding_metrics"]
