"""grid_nav: a stateful multimodal environment -- walk a small map to its goal, seeing a new
image of the cells around you after every move (issue #58).

The world is a record's `grid` field (written by `mmrl data generate grid_nav`):

    {"map": ["..#", "#.."], "start": [r, c], "goal": [r, c], "max_moves": n,
     "window": w, "cell": px}

`map` rows of '.' (floor) and '#' (wall). The model sees a `window` x `window` view of the map,
`cell` pixels a cell, with itself at the view's anchor ((window - 1) // 2 in both axes: the
centre of an odd window, the top-left cell of a 2 x 2 one). It sees along its own row and column
only (the cells it could walk to); the others, and cells off the map, are drawn as walls, so a
view tells the next move and nothing about the corner beyond it. The record's image is the view
from the start; each model turn names a move (parse_move), and the environment answers with the
view from the new cell. A move into a wall or off the map ends the trajectory (`crashed`), as
does a turn that names no move (`invalid`) and the `max_moves`-th move short of the goal;
reaching the goal ends it with `success` 1.0.

`blank=True` is the control: after each move the view is withheld (a uniform grey image of the
same size), so only the first image shows the world; a policy that learns there learned from the
views. Everything is a function of the record and the moves: same moves, same images.

`view="video"`: each view after a move is a clip instead of an image, the move as it happened:
two frames at 2 fps, the view from the cell left (the trail as it was), then the view from the
cell reached (the image view's picture). Qwen2.5-VL encodes the two as one temporal patch. The
record's own first view stays an image; with `blank`, both frames are grey.
"""
from __future__ import annotations

import re
from collections import deque
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from mmrl.envs.base import ENVIRONMENTS, Environment, Step
from mmrl.types import Sample, Trajectory, Video

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
COLOURS = {"wall": (40, 40, 40), "floor": (235, 235, 235), "trail": (160, 160, 160),
           "agent": (40, 90, 220), "goal": (40, 180, 60), "blank": (128, 128, 128)}
_MOVE = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_move(text: str) -> str | None:
    """The move a model turn names, lower-cased: the first of up/down/left/right inside its last
    <answer>...</answer> when it has one (a reasoning model's thoughts name moves too), else in
    the whole turn; None when it names none.

    >>> parse_move("<think>up is a wall</think><answer>Right</answer>"), parse_move("go up, left")
    ('right', 'up')
    >>> parse_move("wait"), parse_move("<answer>stay</answer> then down")
    (None, None)
    """
    answers = _ANSWER.findall(text)
    found = _MOVE.search(answers[-1] if answers else text)
    return found.group(1).lower() if found else None


def is_floor(grid: dict, cell: tuple[int, int]) -> bool:
    r, c = cell
    rows = grid["map"]
    return 0 <= r < len(rows) and 0 <= c < len(rows[r]) and rows[r][c] != "#"


def distances(grid: dict) -> dict[tuple[int, int], int]:
    """Moves from each reachable floor cell to the goal (breadth-first from the goal)."""
    goal = tuple(grid["goal"])
    out, todo = {goal: 0}, deque([goal])
    while todo:
        r, c = todo.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if nxt not in out and is_floor(grid, nxt):
                out[nxt] = out[(r, c)] + 1
                todo.append(nxt)
    return out


def render(grid: dict, at: tuple[int, int], trail: set | frozenset = frozenset()) -> Image.Image:
    """The view from cell `at`: `window` x `window` cells of `cell` px around it (the agent at
    the anchor, seeing along its row and column), walls dark, floor light, cells already walked
    (`trail`) grey, the goal green."""
    w, px = grid["window"], grid["cell"]
    anchor = (w - 1) // 2
    goal = tuple(grid["goal"])
    im = Image.new("RGB", (w * px, w * px), COLOURS["wall"])
    draw = ImageDraw.Draw(im)
    for i in range(w):
        for j in range(w):
            if i != anchor and j != anchor:
                continue  # out of line: drawn as wall
            cell = (at[0] - anchor + i, at[1] - anchor + j)
            kind = ("agent" if cell == tuple(at) else "goal" if cell == goal
                    else "trail" if cell in trail else "floor" if is_floor(grid, cell) else None)
            if kind:
                draw.rectangle([j * px, i * px, (j + 1) * px - 1, (i + 1) * px - 1],
                               fill=COLOURS[kind])
    return im


def blank_view(grid: dict) -> Image.Image:
    """The control's view: one grey, the size of a real view."""
    side = grid["window"] * grid["cell"]
    return Image.new("RGB", (side, side), COLOURS["blank"])


class GridNav(Environment):
    """One trajectory's walk (state: the agent's cell, the cells walked, the moves made)."""

    VIEWS = ("image", "video")
    CLIP_FPS = 2.0

    def __init__(self, blank: bool = False, view: str = "image"):
        if view not in self.VIEWS:
            raise ValueError(f"grid_nav: view {view!r}; one of {', '.join(self.VIEWS)} (env.args)")
        self.blank, self.view = bool(blank), view
        self.grid: dict[str, Any] = {}

    def reset(self, sample: Sample) -> Sample:
        grid = sample.fields.get("grid")
        if not isinstance(grid, dict) or not {"map", "start", "goal", "max_moves", "window",
                                              "cell"} <= set(grid):
            raise ValueError(f"grid_nav: record {sample.id!r} has no complete `grid` field "
                             f"(map, start, goal, max_moves, window, cell; `mmrl data generate "
                             f"grid_nav` writes it)")
        self.grid = grid
        self.at = tuple(grid["start"])
        self.trail = {self.at}
        self.moves = 0
        self.dist = distances(grid)
        if self.at not in self.dist:
            raise ValueError(f"grid_nav: record {sample.id!r}: the goal cannot be reached")
        self.best = self.dist[self.at]
        return sample  # the record's image is the view from the start

    def info(self, **flags: bool) -> dict[str, Any]:
        """`success` (1.0 at the goal), `progress` (the share of the start's distance to the
        goal covered at best), `moves`, and whether the walk `crashed` or a turn was `invalid`."""
        start = self.dist[tuple(self.grid["start"])]
        out = {"success": float(self.at == tuple(self.grid["goal"])),
               "progress": 1.0 - self.best / start if start else 1.0, "moves": self.moves,
               "crashed": False, "invalid": False}
        return {**out, **flags}

    def step(self, trajectory: Trajectory, text: str) -> Step:
        move = parse_move(text)
        if move is None:
            return Step(done=True, info=self.info(invalid=True))
        dr, dc = MOVES[move]
        nxt = (self.at[0] + dr, self.at[1] + dc)
        self.moves += 1
        if not is_floor(self.grid, nxt):
            return Step(done=True, info=self.info(crashed=True))
        left, self.at = self.at, nxt
        self.best = min(self.best, self.dist.get(nxt, self.best))
        if nxt == tuple(self.grid["goal"]) or self.moves >= self.grid["max_moves"]:
            return Step(done=True, info=self.info())
        view = self._view(nxt)
        if self.view == "video":  # the move as a clip: from the cell left, trail as it was
            frames = [self._view(left, self.trail - {left}), view]
            view = Video(frames=np.stack([np.asarray(f) for f in frames]), fps=self.CLIP_FPS,
                         timestamps=[0.0, 1 / self.CLIP_FPS], duration=2 / self.CLIP_FPS)
        self.trail.add(nxt)
        return Step(observation=[view], info=self.info())

    def _view(self, at: tuple[int, int], trail: set | None = None) -> Image.Image:
        if self.blank:
            return blank_view(self.grid)
        return render(self.grid, at, self.trail if trail is None else trail)


ENVIRONMENTS.add("grid_nav", GridNav)
