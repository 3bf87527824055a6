"""Benchmark: rewards.vectorized (token-ID BLEU, WER) vs per-pair loops over reference libraries.

    python scripts/bench_rewards.py                      # 4096 pairs, 20-60 tokens, CPU, 1 thread
    python scripts/bench_rewards.py --batch 4096 --device cuda --json out.json
    python scripts/bench_rewards.py --threads 0          # torch's default thread count

The loops are what a reward function without the fast path does: sacrebleu.sentence_bleu (and
NLTK sentence_bleu, if installed) on token strings, jiwer.wer on token strings. Before timing, the
vectorized results are checked against NLTK (BLEU, method1 smoothing) and jiwer (WER) on the
same data, so the speed-up is between implementations that agree.

On a CPU shared with other jobs, several torch threads can be far slower than one: OpenMP threads
spin at every barrier while their partner is descheduled (measured on a loaded 2-core box: 0.3x
with 2 threads, 12x with 1). OMP_WAIT_POLICY=PASSIVE avoids that if you want the threads.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import torch  # noqa: E402

from rewards.vectorized import pad_batch, token_bleu, token_wer  # noqa: E402


def make_pairs(batch: int, min_len: int, max_len: int, vocab: int, seed: int):
    """Candidate/reference token lists; candidates are noisy copies so that n-grams overlap."""
    rng = random.Random(seed)
    cands, refs = [], []
    for _ in range(batch):
        ref = [rng.randint(1, vocab) for _ in range(rng.randint(min_len, max_len))]
        cand = [t if rng.random() < 0.7 else rng.randint(1, vocab) for t in ref]
        if rng.random() < 0.5:
            cand = cand[: rng.randint(1, len(cand))]  # truncated: brevity penalty
        cands.append(cand)
        refs.append(ref)
    return cands, refs


def as_words(sequences) -> list[str]:
    """Token ids as text ("t12 t7 ..."), one word per token, for the string-based libraries."""
    return [" ".join(f"t{t}" for t in s) for s in sequences]


def best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (lazy imports, allocator, CUDA context)
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def check_agreement(cands, refs, bleu, wer) -> dict[str, float]:
    """Max absolute difference to NLTK BLEU and jiwer WER on a sample of the batch."""
    import jiwer

    hyp_words, ref_words = as_words(cands), as_words(refs)
    sample = range(0, len(cands), max(1, len(cands) // 512))
    out = {"wer_max_abs_diff": max(abs(wer[i] - jiwer.wer(ref_words[i], hyp_words[i]))
                                   for i in sample)}
    try:
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    except ImportError:
        return out
    smooth = SmoothingFunction().method1
    out["bleu_max_abs_diff_vs_nltk"] = max(
        abs(bleu[i] - sentence_bleu([refs[i]], cands[i], smoothing_function=smooth))
        for i in sample)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--min-len", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=60)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    # One thread by default: the baselines are single-threaded Python loops, so the ratio then
    # measures the algorithm, not the core count (and OpenMP spin-waits on a busy machine).
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import jiwer
    import sacrebleu

    cands, refs = make_pairs(args.batch, args.min_len, args.max_len, args.vocab, args.seed)
    cand_t, cand_len = pad_batch(cands, device=args.device)
    ref_t, ref_len = pad_batch(refs, device=args.device)
    cand_str, ref_str = as_words(cands), as_words(refs)

    def vec_bleu():
        return token_bleu(cand_t, ref_t, cand_lengths=cand_len, ref_lengths=ref_len)

    def vec_wer():
        return token_wer(cand_t, ref_t, hyp_lengths=cand_len, ref_lengths=ref_len)

    results = {"batch": args.batch, "lengths": [args.min_len, args.max_len],
               "device": args.device, "torch_threads": torch.get_num_threads()}
    results.update(check_agreement(cands, refs, vec_bleu().tolist(), vec_wer().tolist()))
    results["token_bleu_s"] = best_time(vec_bleu, args.repeats)
    results["sacrebleu_loop_s"] = best_time(
        lambda: [sacrebleu.sentence_bleu(h, [r]) for h, r in zip(cand_str, ref_str)], args.repeats)
    try:
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

        smooth = SmoothingFunction().method1
        results["nltk_loop_s"] = best_time(
            lambda: [sentence_bleu([r], c, smoothing_function=smooth) for c, r in zip(cands, refs)],
            1)
    except ImportError:
        pass
    results["token_wer_s"] = best_time(vec_wer, args.repeats)
    results["jiwer_loop_s"] = best_time(
        lambda: [jiwer.wer(r, h) for h, r in zip(cand_str, ref_str)], args.repeats)

    results["speedup_bleu_vs_sacrebleu"] = results["sacrebleu_loop_s"] / results["token_bleu_s"]
    if "nltk_loop_s" in results:
        results["speedup_bleu_vs_nltk"] = results["nltk_loop_s"] / results["token_bleu_s"]
    results["speedup_wer_vs_jiwer"] = results["jiwer_loop_s"] / results["token_wer_s"]
    for key, value in results.items():
        shown = f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else value
        print(f"{key:28s} {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
