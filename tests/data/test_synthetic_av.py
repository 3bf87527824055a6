"""Video / audio / grounding generators: same bytes twice, records load, and the media really
show what the solution says (decoded back and measured)."""
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.data import synthetic_av  # noqa: F401  (registers the generators)
from mmrl.data.media import load_audio, load_video
from mmrl.data.schema import load_samples
from mmrl.data.synthetic import GENERATORS

NAMES = ["video_qa", "temporal_grounding", "asr", "audio_qa", "detection", "classification",
         "captioning"]
SMALL = {"n_train": 6, "n_eval": 2}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    return {name: GENERATORS.get(name)(root / name, seed=3, **SMALL) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_loadable(name, generated, tmp_path):
    first = Path(generated[name]["train"]).parent
    GENERATORS.get(name)(tmp_path / "again", seed=3, **SMALL)
    assert _tree(first) == _tree(tmp_path / "again")  # same bytes, media included
    GENERATORS.get(name)(tmp_path / "again", seed=3, **SMALL)  # idempotent over itself
    assert _tree(first) == _tree(tmp_path / "again")
    GENERATORS.get(name)(tmp_path / "other", seed=4, **SMALL)
    assert _tree(first) != _tree(tmp_path / "other")
    train, evals = load_samples(generated[name]["train"]), load_samples(generated[name]["eval"])
    assert len(train) == 6 and len(evals) == 2
    assert {s.task for s in [*train, *evals]} == {name}
    for s in train:
        for p in s.images + s.videos + s.audios:
            assert Path(p).is_file()


def test_video_qa_square_moves_as_answered(generated):
    for s in load_samples(generated["video_qa"]["train"]):
        v = load_video(s.videos[0], nframes=8)
        centres = []
        for f in v.frames[[0, -1]]:
            ys, xs = np.nonzero(np.abs(f.astype(int) - 255).sum(axis=2) > 150)
            centres.append((xs.mean(), ys.mean()))
        (x0, y0), (x1, y1) = centres
        direction = ({True: "right", False: "left"}[x1 > x0] if abs(x1 - x0) > abs(y1 - y0)
                     else {True: "down", False: "up"}[y1 > y0])
        assert s.fields["options"]["ABCD".index(s.solution)] == f"{s.solution}. {direction}"
        assert s.fields["problem_type"] == "multiple choice"


def test_video_qa_first_colour_is_the_answer_and_both_colours_are_shown(tmp_path):
    from mmrl.data.synthetic_av import COLORS

    made = GENERATORS.get("video_qa")(tmp_path, seed=3, question="first_colour", n_train=12,
                                      n_eval=2)
    firsts = set()
    for s in load_samples(made["train"]):
        v = load_video(s.videos[0], nframes=8)

        def colour(f):  # the named colour nearest to the square's mean pixel
            px = f[np.abs(f.astype(int) - 255).sum(axis=2) > 150].mean(axis=0)
            return min(COLORS, key=lambda c: np.abs(px - np.array(COLORS[c])).sum())
        seen = [colour(f) for f in v.frames]
        first = seen[0]
        assert s.fields["options"]["ABCD".index(s.solution)] == f"{s.solution}. {first}"
        # One switch, to another colour: the order, not the set of colours, is the answer.
        assert len(set(seen)) == 2 and seen == sorted(seen, key=seen.index)
        firsts.add(first)
    assert len(firsts) >= 3  # the answer is not one colour


def test_temporal_grounding_square_visible_exactly_in_segment(generated):
    for s in load_samples(generated["temporal_grounding"]["train"]):
        dur = s.fields["duration"]
        v = load_video(s.videos[0], fps=4.0, max_frames=1000)  # every frame
        red = [bool(((f[..., 0] > 150) & (f[..., 1] < 100)).sum() > 20) for f in v.frames]
        start, end = s.solution
        expected = [start <= t < end for t in v.timestamps]
        assert red == expected and v.duration == dur and 4 <= dur <= 8


def test_asr_first_tone_matches_its_digit(generated):
    from mmrl.data.synthetic_av import DIGIT_WORDS, DTMF

    for s in load_samples(generated["asr"]["train"]):
        x = load_audio(s.audios[0])
        tone = x[int(0.11 * 16000):int(0.24 * 16000)]  # first digit: 0.1 s .. 0.25 s
        spectrum = np.abs(np.fft.rfft(tone * np.hanning(len(tone))))
        freqs = np.fft.rfftfreq(len(tone), 1 / 16000)
        low = freqs[np.argmax(np.where(freqs < 1000, spectrum, 0))]
        high = freqs[np.argmax(np.where(freqs > 1100, spectrum, 0))]
        digit = DIGIT_WORDS.index(s.solution.split()[0])
        assert abs(low - DTMF[digit][0]) < 20 and abs(high - DTMF[digit][1]) < 20
        n_words = len(s.solution.split())
        assert len(x) == pytest.approx((0.15 + 0.2 * n_words) * 16000, abs=2)


def test_audio_qa_beep_count(generated):
    for s in load_samples(generated["audio_qa"]["train"]):
        x = load_audio(s.audios[0])
        loud = np.abs(x).reshape(-1, 160).max(axis=1) > 0.1  # 10 ms windows
        beeps = int(np.sum(loud[1:] & ~loud[:-1]) + loud[0])
        assert "ABCD"[beeps - 1] == s.solution


def test_detection_box_is_the_red_square(generated):
    for s in load_samples(generated["detection"]["train"]):
        im = np.asarray(Image.open(s.images[0]).convert("RGB")).astype(int)
        mask = (im[..., 0] == 220) & (im[..., 1] == 30) & (im[..., 2] == 30)
        labels = [o["label"] for o in s.fields["objects"]]
        assert labels[0] == "red square" and labels.count("red square") == 1
        # Red pixels may also belong to a red circle/triangle distractor: check inside the box.
        x1, y1, x2, y2 = s.solution
        assert mask[y1:y2, x1:x2].all() and s.fields["image_size"] == [56, 56]


def test_classification_solution_is_sorted_set(generated):
    for s in load_samples(generated["classification"]["train"]):
        items = s.solution.split(", ")
        assert items == sorted(set(items)) and set(items) <= {"circle", "square", "triangle"}


def test_64_samples_are_fast(tmp_path):
    for name in ("video_qa", "temporal_grounding", "asr"):
        t = time.perf_counter()
        GENERATORS.get(name)(tmp_path / name, n_train=48, n_eval=16)
        assert time.perf_counter() - t < 5.0


def test_falling_ball_clips_give_time_a_direction(tmp_path):
    """The temporal_jigsaw row's stand-in for the user's videos: in every clip the ball is lower
    in each frame than in the one before, so in-order and swapped halves differ."""
    from mmrl.data.synthetic_av import paint_falling

    for path in paint_falling(tmp_path, n=3, size=56, frames=8, fps=4):
        frames = load_video(str(path), nframes=8, max_frames=8).frames.astype(float)
        dark = frames.mean(-1) < frames.mean(-1).mean() - 20  # the ball is darker than the back
        rows = [np.nonzero(d.any(1))[0].mean() for d in dark]
        assert all(b > a for a, b in zip(rows, rows[1:])), rows
