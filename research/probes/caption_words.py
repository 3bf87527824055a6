"""Score a run's captions word by word: did RL fix the caption's length, or its words?

Reads `mmrl eval` rows (a run's eval/<name>.jsonl: `answer`, `solution`) and prints, per file,
how many answers have the reference's word count, the share of wrong words at each position
among those, and how often each of `--words` is said against how often the references say it.
A word the references use that no answer says (a shape never named) is a word the model does not
read.

    python research/probes/caption_words.py runs/learning/captioning_s0/eval/before_rl.jsonl \\
        runs/learning/captioning_s0/eval/after_rl.jsonl [--words circle,square,triangle]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter


def score(rows: list[dict], words: list[str]) -> dict:
    """{"n", "wrong_length", "wrong_at": {position: share wrong}, "said": {w: n}, "meant": {w: n}}
    over answers compared as whitespace-split words with their references."""
    wrong_length, wrong, same_length = 0, Counter(), Counter()
    said, meant = Counter(), Counter()
    for r in rows:
        answer, reference = (r.get("answer") or "").split(), str(r["solution"]).split()
        said.update(w for w in answer if w in words)
        meant.update(w for w in reference if w in words)
        if len(answer) != len(reference):
            wrong_length += 1
            continue
        for i, (a, b) in enumerate(zip(answer, reference)):
            same_length[i] += 1
            wrong[i] += a != b
    return {"n": len(rows), "wrong_length": wrong_length,
            "wrong_at": {i: wrong[i] / same_length[i] for i in sorted(same_length)},
            "said": {w: said[w] for w in words}, "meant": {w: meant[w] for w in words}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="eval jsonl files of a run (eval/after_rl.jsonl ...)")
    p.add_argument("--words", default="circle,square,triangle",
                   help="comma-separated words to count (default: the shapes)")
    args = p.parse_args(argv)
    words = [w for w in args.words.split(",") if w]
    for path in args.files:
        with open(path) as f:
            s = score([json.loads(line) for line in f if line.strip()], words)
        at = " ".join(f"{i + 1}:{v:.2f}" for i, v in s["wrong_at"].items())
        counts = "  ".join(f"{w} {s['said'][w]}/{s['meant'][w]}" for w in words)
        print(f"{path}: {s['n']} answers  wrong length {s['wrong_length']}  "
              f"wrong word by position {at or '-'}  said/meant: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
