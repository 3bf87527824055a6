"""Is a no-tool control blind to what must be read, and if it scores above chance, by what?

For a control run (e.g. runs/learning/video_search_no_tool_s4), decodes each held-out record's
media as the run's evaluation did (its config.yaml: data.eval and the decode settings, through
mmrl's own media loader) and prints:

- how many records show any colour in what the model was given (a pixel whose channels differ
  by more than `--tolerance`): video_search's flash is a colour on grey, so 0 means the first
  look cannot show it;
- the after-RL answers (eval/after_rl.jsonl, first draw), and for each answer given, the labels
  of the records it was given on: a control that splits the records by something it can see
  (where the card falls) scores what that split happens to share with the labels.

    python research/probes/blind_control.py runs/learning/video_search_no_tool_s4
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def coloured(frames, tolerance: float) -> bool:
    """Whether any pixel of `frames` ([..., 3] uint8) has channels further apart than
    `tolerance` (grey: R = G = B)."""
    a = np.asarray(frames).astype(np.int16)
    return bool((a.max(-1) - a.min(-1) > tolerance).any())


def report(run: Path, tolerance: float = 8.0) -> dict:
    """{"records", "coloured", "answers": {answer: Counter(labels)}, "accuracy"}."""
    from mmrl import config
    from mmrl.data.prepare import media_loader
    from mmrl.data.schema import load_samples
    from mmrl.models import get_adapter

    cfg = config.load(str(run / "config.yaml"))
    load = media_loader(cfg, get_adapter(cfg.model.family).image_factor)
    samples = {s.id: s for s in load_samples(cfg.data.eval)}
    rows = [json.loads(ln) for ln in (run / "eval" / "after_rl.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("draw", 0) == 0]
    seen = 0
    answers: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        media = load(samples[r["id"]])
        shown = [np.asarray(v.frames) for v in media.get("videos") or []] + \
                [np.asarray(im.convert("RGB")) for im in media.get("images") or []]
        seen += any(coloured(x, tolerance) for x in shown)
        answers[str(r.get("answer"))][str(r.get("solution"))] += 1
    right = sum(c[a] for a, c in answers.items())
    return {"records": len(rows), "coloured": seen, "answers": dict(answers),
            "accuracy": right / max(1, len(rows))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--tolerance", type=float, default=8.0)
    args = ap.parse_args(argv)
    for run in args.runs:
        out = report(run, args.tolerance)
        print(f"{run}: {out['coloured']} of {out['records']} records show colour in what the "
              f"model was given; accuracy {out['accuracy']:.2f}")
        for answer, labels in sorted(out["answers"].items()):
            print(f"  answered {answer!r} on {sum(labels.values())}: labels "
                  + ", ".join(f"{k} {v}" for k, v in sorted(labels.items())))


if __name__ == "__main__":
    main()
