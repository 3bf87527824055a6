"""The looked_at reward: did a call that worked read a region holding the record's target whole?
Hand-checked on boxes and spans, and as a property against a brute-force containment check."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import REWARDS, get_reward

looked_at = get_reward("looked_at")
MARK = [100, 100, 104, 104]


def crop(box, error=None):
    return {"name": "crop", "turn": 0, "error": error, "seen": [{"media": "image", "box": box}]}


def test_a_crop_holding_the_whole_mark_scores_one():
    calls = [[crop([90, 90, 120, 120])],            # holds it
             [crop([102, 90, 130, 130])],           # cuts it: not found
             [crop([0, 0, 50, 50]), crop([96, 96, 104, 104])],  # the second look found it
             [crop([90, 90, 120, 120], error="timeout")],       # a failed call read nothing
             []]                                    # no call
    assert looked_at(["<answer>A</answer>"] * 5, None, calls=calls, target="mark_box",
                     mark_box=[MARK] * 5) == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_a_span_target_is_checked_against_the_spans_read():
    frames = {"name": "frames", "turn": 0, "error": None,
              "seen": [{"media": "video", "span": [2.0, 5.5]}]}
    assert looked_at(["x", "x"], None, calls=[[frames], [frames]], target="flash_span",
                     flash_span=[[3.0, 3.5], [5.0, 6.0]]) == [1.0, 0.0]


def test_rows_without_calls_or_a_target_are_not_scored():
    assert looked_at(["x", "x"], None, target="mark_box", mark_box=[MARK, MARK]) == [None, None]
    assert looked_at(["x", "x"], None, calls=[[], []]) == [None, None]  # no target_box field
    assert looked_at(["x", "x"], None, calls=[[], []], target="mark_box",
                     mark_box=[MARK, "B"]) == [0.0, None]
    assert REWARDS.params("looked_at")["target"] == "target_box"


coord = st.integers(0, 60)


@settings(max_examples=200, deadline=None)
@given(target=st.tuples(coord, coord, coord, coord),
       boxes=st.lists(st.tuples(st.tuples(coord, coord, coord, coord), st.booleans()),
                      max_size=4))
def test_found_exactly_when_some_working_call_holds_every_pixel(target, boxes):
    x1, y1 = min(target[0], target[2]), min(target[1], target[3])
    goal = [x1, y1, max(target[0], target[2]), max(target[1], target[3])]
    calls = [crop(list(b), error=None if ok else "bad_box") for b, ok in boxes]
    want = any(ok and all(b[0] <= x <= b[2] and b[1] <= y <= b[3]
                          for x in (goal[0], goal[2]) for y in (goal[1], goal[3]))
               for b, ok in boxes)
    assert looked_at(["x"], None, calls=[calls], target="mark_box",
                     mark_box=[goal]) == [float(want)]


def test_max_ratio_counts_only_looks_close_enough_to_read_the_mark():
    calls = [[crop([96, 96, 112, 112])],           # 16 px around a 4-px mark: 4x
             [crop([0, 0, 1344, 1344])],           # the whole image holds it, far too small
             [crop([96, 90, 112, 130])]]           # 4x wide, 10x tall
    kw = dict(target="mark_box", mark_box=[MARK] * 3)
    assert looked_at(["x"] * 3, None, calls=calls, **kw) == [1.0, 1.0, 1.0]
    assert looked_at(["x"] * 3, None, calls=calls, max_ratio=4, **kw) == [1.0, 0.0, 0.0]
    assert REWARDS.params("looked_at")["max_ratio"] is None
