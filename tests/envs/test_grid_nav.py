"""grid_nav (mmrl/envs/grid_nav.py, mmrl/data/synthetic_grid.py, rewards/env_info.py): the walk's
transitions, the views it returns (pixel by pixel), the blank-view control, its info and the
rewards that read it, and the generator's records (deterministic, first image = the env's view)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from mmrl.data.schema import load_samples
from mmrl.data.synthetic import GENERATORS
from mmrl.envs import ENVIRONMENTS
from mmrl.envs.grid_nav import COLOURS, GridNav, parse_move, render
from mmrl.types import Sample
from rewards import get_reward

# An L-shaped corridor: (0,0) -> (0,1) -> (0,2) -> (1,2) -> (2,2), the goal.
GRID = {"map": ["...", "##.", "##."], "start": [0, 0], "goal": [2, 2], "max_moves": 6,
        "window": 3, "cell": 4}


def sample(grid: dict = GRID) -> Sample:
    return Sample(id="g", messages=[], fields={"grid": grid})


def cells(im: Image.Image, px: int) -> list[list[tuple]]:
    """The colour at each cell's centre, row by row."""
    a = np.asarray(im)
    n = a.shape[0] // px
    return [[tuple(int(v) for v in a[i * px + px // 2, j * px + px // 2]) for j in range(n)]
            for i in range(n)]


W, F, T, A, G = (COLOURS[k] for k in ("wall", "floor", "trail", "agent", "goal"))


def test_view_shows_row_and_column_only():
    # From (0,1): up is off the map (wall), left (0,0) floor, right (0,2) floor, down (1,1) wall;
    # the corners are out of line and drawn as walls whatever the map holds there.
    assert cells(render(GRID, (0, 1)), 4) == [[W, W, W], [F, A, F], [W, W, W]]
    # From (1,2), having walked (0,0)..(0,2): up is trail, down is the goal, left a wall.
    assert cells(render(GRID, (1, 2), {(0, 0), (0, 1), (0, 2)}), 4) == [[W, T, W], [W, A, W],
                                                                        [W, G, W]]
    two = {**GRID, "window": 2}  # a 2 x 2 view: the agent top-left, right and below shown
    assert cells(render(two, (0, 1)), 4) == [[A, F], [W, W]]
    assert render(GRID, (0, 1)).tobytes() == render(GRID, (0, 1)).tobytes()


def test_a_turn_names_its_move_in_its_last_answer_else_in_its_text():
    assert parse_move("<think>up is a wall</think><answer>Right</answer>") == "right"
    assert parse_move("<answer>up</answer><answer>down</answer>") == "down"
    assert parse_move("go up, then left") == "up"
    assert parse_move("upward") is None and parse_move("<answer>stay</answer> down") is None


def test_walk_to_goal():
    env = ENVIRONMENTS.get("grid_nav")()
    assert env.reset(sample()) is not None
    for moves, text in enumerate(["right", "go right please", "<answer>Down</answer>"], 1):
        step = env.step(None, text)
        assert not step.done and len(step.observation) == 1
        assert step.info["moves"] == moves and step.info["success"] == 0.0
        assert step.info["progress"] == moves / 4  # 4 moves from the start to the goal
    # The view after "right, right, down" is the one from (1,2) with the corridor walked.
    assert step.observation[0].tobytes() == render(GRID, (1, 2), {(0, 0), (0, 1), (0, 2)}).tobytes()
    last = env.step(None, "down")
    assert last.done and last.info == {"success": 1.0, "progress": 1.0, "moves": 4,
                                       "crashed": False, "invalid": False}
    env.close()


def test_crash_invalid_and_turn_cap():
    env = GridNav()
    env.reset(sample())
    crash = env.step(None, "down")  # (1,0) is a wall
    assert crash.done and crash.info["crashed"] and crash.info["success"] == 0.0
    assert crash.info["moves"] == 1 and crash.info["progress"] == 0.0
    env.reset(sample())
    env.step(None, "right")
    bad = env.step(None, "I think I will wait")
    assert bad.done and bad.info["invalid"] and bad.info["moves"] == 1
    assert bad.info["progress"] == 0.25
    off = GridNav()
    off.reset(sample())
    assert off.step(None, "up").info["crashed"]  # off the map
    capped = GridNav()
    capped.reset(sample({**GRID, "max_moves": 3}))
    for text in ("right", "left", "right"):  # back and forth: floor, but no nearer
        step = capped.step(None, text)
    assert step.done and step.info["moves"] == 3 and step.info["success"] == 0.0
    assert step.info["progress"] == 0.25 and not step.info["crashed"]


def test_blank_control_withholds_every_view():
    real, blank = GridNav(), ENVIRONMENTS.get("grid_nav")(blank=True)
    for env in (real, blank):
        env.reset(sample())
    for text in ("right", "right", "down"):
        a, b = real.step(None, text), blank.step(None, text)
        assert a.info == b.info and a.done == b.done  # the same world, only the view differs
        assert b.observation[0].size == a.observation[0].size == (12, 12)
        assert np.all(np.asarray(b.observation[0]) == COLOURS["blank"])
        assert len(np.unique(np.asarray(a.observation[0]).reshape(-1, 3), axis=0)) > 1


def test_video_view_is_the_move_as_a_two_frame_clip():
    image, video, blank = GridNav(), GridNav(view="video"), GridNav(blank=True, view="video")
    for env in (image, video, blank):
        env.reset(sample())
    before = render(GRID, (0, 0))  # the record's own first view
    for text in ("right", "right", "down"):
        a, v, b = image.step(None, text), video.step(None, text), blank.step(None, text)
        assert v.info == a.info and v.done == a.done and b.info == a.info
        if a.done:
            break
        (clip,) = v.observation
        assert clip.frames.shape == (2, 12, 12, 3) and clip.frames.dtype == np.uint8
        assert clip.fps == 2.0 and clip.timestamps == [0.0, 0.5]
        assert np.array_equal(clip.frames[0], np.asarray(before))  # where it stood
        assert np.array_equal(clip.frames[1], np.asarray(a.observation[0]))  # where it is
        assert np.all(b.observation[0].frames == COLOURS["blank"])
        before = a.observation[0]
    with pytest.raises(ValueError, match="view 'clip'; one of image, video"):
        GridNav(view="clip")


def test_reset_refuses_a_record_without_a_world():
    with pytest.raises(ValueError, match="grid"):
        GridNav().reset(Sample(id="x", messages=[]))
    walled = {**GRID, "map": ["..#", "###", "##."]}
    with pytest.raises(ValueError, match="cannot be reached"):
        GridNav().reset(sample(walled))


def test_rewards_read_info():
    # {}: a trajectory whose environment said nothing (a turn cut before any step): not a success
    info = [{"success": 1.0, "progress": 1.0}, {"success": 0.0, "progress": 0.25}, {}]
    assert get_reward("success")(["a", "b", "c"], None, info=info) == [1.0, 0.0, 0.0]
    assert get_reward("progress")(["a", "b", "c"], None, info=info) == [1.0, 0.25, 0.0]
    assert get_reward("success")(["a"], None) == [None]  # no environment: not scored


def _digest(folder) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("kwargs", [{}, {"moves": "right_down", "window": 2, "cell": 14,
                                         "prompt": "Move."}])
def test_generator_is_deterministic_and_solvable(tmp_path, kwargs):
    a = GENERATORS.get("grid_nav")(tmp_path / "a", n_train=12, n_eval=4, **kwargs)
    GENERATORS.get("grid_nav")(tmp_path / "b", n_train=12, n_eval=4, **kwargs)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    GENERATORS.get("grid_nav")(tmp_path / "c", n_train=12, n_eval=4, seed=1, **kwargs)
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")
    for s in [*load_samples(a["train"]), *load_samples(a["eval"])]:
        grid = s.fields["grid"]
        first = Image.open(s.images[0]).convert("RGB")
        assert first.tobytes() == render(grid, tuple(grid["start"])).tobytes()
        env = GridNav()
        env.reset(s)
        moves = s.solution.split()
        assert len(moves) == 5 and grid["max_moves"] == 7
        if kwargs:
            assert set(moves) <= {"right", "down"}
        for k, move in enumerate(moves):  # the solution walks the corridor to the goal
            step = env.step(None, move)
            assert step.done == (k == len(moves) - 1)
        assert step.info["success"] == 1.0
    rows = [json.loads(line) for line in open(a["train"])]
    assert {r["task"] for r in rows} == {"grid_nav"} and len(rows) == 12


def test_every_view_shows_one_way_on(tmp_path):
    """A corridor: from each cell of the walk, exactly one neighbour in view is unwalked floor or
    the goal, and it is the solution's next move (so a blind walk guesses, a seeing one reads)."""
    out = GENERATORS.get("grid_nav")(tmp_path, n_train=30, n_eval=0)
    for s in load_samples(out["train"]):
        grid, env = s.fields["grid"], GridNav()
        env.reset(s)
        view = Image.open(s.images[0]).convert("RGB")
        for move in s.solution.split():
            c = cells(view, grid["cell"])
            around = {"up": c[0][1], "down": c[2][1], "left": c[1][0], "right": c[1][2]}
            assert [k for k, v in around.items() if v in (F, G)] == [move]
            step = env.step(None, move)
            if not step.done:
                view = step.observation[0]
