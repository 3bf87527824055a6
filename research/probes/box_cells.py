"""Score a run's predicted boxes by grid row and column: is a model that misses the target
finding the wrong row, the wrong column, or the right cell imprecisely?

Reads `mmrl eval` rows (a run's eval/<name>.jsonl: `answer` "[x1, y1, x2, y2]", `solution`,
`fields.image_size`) and splits each image into `--cells` x `--cells` equal cells. A column rate
near chance (1/cells) beside a good row rate is the M-RoPE width fault of
recipes/detection/README.md.

    python research/probes/box_cells.py runs/learning/detection_s0/eval/before_rl.jsonl [--cells 3]
"""
from __future__ import annotations

import argparse
import json
import sys

from rewards.boxes import box_iou, parse_box


def cell(box: list[float], size: list[int], cells: int) -> tuple[int, int]:
    """(column, row) of the box centre on a cells x cells grid over an image of `size` (w, h)."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return (min(int(cx * cells / size[0]), cells - 1), min(int(cy * cells / size[1]), cells - 1))


def score(rows: list[dict], cells: int) -> dict:
    """Fractions of rows with the right column / row / cell, and mean IoU where the cell is right;
    rows whose answer holds no box (`rewards.boxes.parse_box`) count as misses (`unparsed`)."""
    col = row = both = unparsed = 0
    in_cell = []
    for r in rows:
        box = parse_box(r.get("answer") or "")  # read as the box rewards read it
        if box is None:
            unparsed += 1
            continue
        size = r["fields"]["image_size"]
        got, want = cell(box, size, cells), cell(r["solution"], size, cells)
        col += got[0] == want[0]
        row += got[1] == want[1]
        if got == want:
            both += 1
            in_cell.append(box_iou(box, r["solution"]))
    n = len(rows)
    return {"n": n, "column": col / n, "row": row / n, "cell": both / n, "unparsed": unparsed / n,
            "iou_in_right_cell": sum(in_cell) / len(in_cell) if in_cell else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="eval jsonl files of a run (eval/before_rl.jsonl ...)")
    p.add_argument("--cells", type=int, default=3, help="grid cells a side (default 3)")
    args = p.parse_args(argv)
    for path in args.files:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        s = score(rows, args.cells)
        right = "-" if s["iou_in_right_cell"] is None else f"{s['iou_in_right_cell']:.2f}"
        print(f"{path}: {s['n']} boxes  column {s['column']:.2f}  row {s['row']:.2f}  "
              f"cell {s['cell']:.2f}  IoU in the right cell {right}  unparsed {s['unparsed']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
