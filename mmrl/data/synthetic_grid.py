"""The grid_nav task (registered into GENERATORS): records of small maps for the grid_nav
environment (mmrl/envs/grid_nav.py), each with its first view as the record's image.

Every map is one corridor of floor through walls, from the start to the goal `length` moves
away: `moves="right_down"` walks right or down by a coin flip each move (the view of a 2 x 2
window, the agent top-left, shows the way on), `moves="any"` is a random walk in all four
directions that never touches itself (a centred odd window shows the way on; the cell walked in
from is drawn as trail). Only the corridor is floor, so the view from each cell shows exactly one
way on, and a walk that cannot see its view guesses every move after the first.
"""
from __future__ import annotations

import random
from pathlib import Path

from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_av import write_split
from mmrl.envs.grid_nav import MOVES, render

PROMPT = ("You are the blue square on a map of walls (dark), floor (white) and cells you have "
          "walked (grey); the image shows the cells in line with you, and the goal is the green "
          "square. Reach the goal: each turn, give one move, <answer>up</answer>, "
          "<answer>down</answer>, <answer>left</answer> or <answer>right</answer>; you then see "
          "the view from your new cell. A move into a wall ends the walk.")


def corridor(rng: random.Random, length: int, moves: str) -> list[str]:
    """`length` moves of a corridor that never touches itself (no floor cell beside another
    floor cell except the one before and after it), drawn from `rng`."""
    names = ["right", "down"] if moves == "right_down" else sorted(MOVES)
    for _ in range(1000):
        cells, path = [(0, 0)], []
        while len(path) < length:
            r, c = cells[-1]
            ok = []
            for name in names:
                nxt = (r + MOVES[name][0], c + MOVES[name][1])
                touching = [x for x in cells[:-1] if abs(x[0] - nxt[0]) + abs(x[1] - nxt[1]) <= 1]
                if nxt not in cells and not touching:
                    ok.append(name)
            if not ok:
                break
            path.append(rng.choice(ok))
            cells.append((r + MOVES[path[-1]][0], c + MOVES[path[-1]][1]))
        if len(path) == length:
            return path
    raise ValueError(f"grid_nav: no corridor of {length} moves found")


def world(path: list[str], window: int, cell: int, slack: int) -> dict:
    """The record's `grid` field for a corridor: the map over the corridor's bounding box."""
    cells = [(0, 0)]
    for name in path:
        cells.append((cells[-1][0] + MOVES[name][0], cells[-1][1] + MOVES[name][1]))
    r0, c0 = min(r for r, _ in cells), min(c for _, c in cells)
    h, w = max(r for r, _ in cells) - r0 + 1, max(c for _, c in cells) - c0 + 1
    floor = {(r - r0, c - c0) for r, c in cells}
    rows = ["".join("." if (r, c) in floor else "#" for c in range(w)) for r in range(h)]
    return {"map": rows, "start": [cells[0][0] - r0, cells[0][1] - c0],
            "goal": [cells[-1][0] - r0, cells[-1][1] - c0], "max_moves": len(path) + slack,
            "window": window, "cell": cell}


@GENERATORS.register("grid_nav")
def grid_nav(out_dir: str | Path, n_train: int = 400, n_eval: int = 100, seed: int = 0,
             length: int = 5, moves: str = "any", window: int = 3, cell: int = 28,
             slack: int = 2, prompt: str | None = None) -> dict[str, str]:
    """Walk a corridor `length` moves to the goal (the grid_nav environment). `moves`:
    "right_down" or "any" (module docstring); `window` x `window` cells of `cell` px a view
    (`window` 2 needs right_down: the agent sits top-left); `max_moves` = length + `slack`.
    Fields: grid (the world, mmrl/envs/grid_nav.py), solution (the moves, space-separated),
    moves (the same as a list: a warm-up's turn k imitates {moves[k]}), images (the view from
    the start). `prompt` replaces the instructions (a tiny model reads none)."""
    if moves not in ("right_down", "any"):
        raise ValueError(f"grid_nav: moves must be 'right_down' or 'any', got {moves!r}")
    if window < 3 and moves != "right_down" or window < 2:
        raise ValueError("grid_nav: a view must show every way on: window >= 3, or window 2 "
                         "with moves=right_down")
    if length < 1 or slack < 0:
        raise ValueError("grid_nav: length must be >= 1 and slack >= 0")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"grid_nav {seed}")
    records = []
    for i in range(n_train + n_eval):
        path = corridor(rng, length, moves)
        grid = world(path, window, cell, slack)
        name = f"images/{i:05d}.png"
        render(grid, tuple(grid["start"])).save(out / name)
        records.append({"id": f"grid-{i:05d}", "task": "grid_nav", "images": [name],
                        "prompt": PROMPT if prompt is None else prompt,
                        "solution": " ".join(path), "moves": path, "grid": grid})
    return write_split(out, records, n_train)
