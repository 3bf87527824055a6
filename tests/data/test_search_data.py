"""The search datasets need their tool: what the model is first given does not hold the answer
(measured on the real downsampling / frame sampling paths), what the right tool call returns
does. And records carry their tools and full-resolution originals through the schema."""
from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
from PIL import Image

from mmrl.models.codec import Codec
from mmrl.data.media import fit_image, load_video
from mmrl.data.schema import RecordError, load_samples, to_sample
from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_search import (PATTERNS, VideoSearchSpec, VisualSearchSpec, search_image,
                                        write_video_search, write_visual_search)
from mmrl.tools import Toolbox, load_tool
from mmrl.tools.base import ToolContext
from mmrl.tools.builtin import crop, frames

BUDGET = 56 * 56  # the generator's default budget_pixels (= data.image_max_pixels)


def visual(out, **kw):
    """A draw from the whole spec: the layout variants the learning rows use included (the
    registered generator takes only the recipe's knobs; research/search_variants.py)."""
    return write_visual_search(out, VisualSearchSpec(**kw))


def video(out, **kw):
    return write_video_search(out, VideoSearchSpec(**kw))


SPEC_WRITERS = {"visual_search": visual, "video_search": video}


def scenes(seed: int) -> dict[str, tuple[Image.Image, dict]]:
    """The same scene with each pattern (the generator draws in a fixed order), in RGB as
    mmrl.data.media.load_image reads the generator's palette PNGs."""
    out = {}
    for p in sorted(PATTERNS):
        im, scene = search_image(random.Random(seed), 1792, 96, 4, p)
        out[p] = (im.convert("RGB"), scene)
    return out


def context_for(image: Image.Image, path: str, budget: int) -> ToolContext:
    small = fit_image(image, 28 * 28, budget)
    from mmrl.types import PromptFeatures, Sample
    prompt = PromptFeatures(sample=Sample(id="x", messages=[], images=[path]), tensors={})
    return ToolContext(prompt=prompt, input_sizes=[small.size], images=[path], videos=[], audios=[],
                       image_pixels=(28 * 28, BUDGET))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pattern_is_unreadable_at_the_budget_and_readable_in_the_crop(seed, tmp_path):
    views = scenes(seed)
    at_budget = [np.asarray(fit_image(im, 28 * 28, BUDGET), np.int16) for im, _ in views.values()]
    assert at_budget[0].shape == (56, 56, 3)
    # At the input budget the four answers' images differ by at most 1 level of 255 anywhere.
    assert max(int(np.abs(a - at_budget[0]).max()) for a in at_budget[1:]) <= 1
    # The crop tool on the mark (in the model's input coordinates) shows them apart.
    crops = []
    for name, (im, scene) in views.items():
        path = tmp_path / f"{name}.png"
        im.save(path)
        ctx = context_for(im, str(path), BUDGET)
        scale = 56 / 1792
        box = [v * scale for v in scene["mark_box"]]
        crops.append(np.asarray(crop(ctx, box)[0], np.int16))
    assert all(c.shape == crops[0].shape for c in crops)
    for i in range(len(crops)):
        for j in range(i + 1, len(crops)):
            differ = (np.abs(crops[i] - crops[j]).max(-1) > 100).sum()
            # Any two patterns differ in 8 of 16 cells, 4x4 px each in the crop: 128 pixels
            # that differ by more than 100 levels (against at most 1 level at the budget).
            assert differ >= 128, (i, j, differ)


def test_visual_search_records_offer_crop_and_the_control_does_not(tmp_path):
    paths = GENERATORS.get("visual_search")(tmp_path / "tool", n_train=4, n_eval=2, seed=0)
    control = GENERATORS.get("visual_search")(tmp_path / "plain", n_train=4, n_eval=2, seed=0,
                                              tools=False)
    with_tools = load_samples(paths["train"])
    without = load_samples(control["train"])
    assert [s.fields["tools"] for s in with_tools] == [["crop"]] * 4
    assert all("tools" not in s.fields for s in without)
    assert [s.solution for s in with_tools] == [s.solution for s in without]
    s = with_tools[0]
    with Image.open(s.images[0]) as im:
        assert im.size == (1792, 1792)
    x1, y1, x2, y2 = s.fields["mark_box"]
    assert (x2 - x1, y2 - y1) == (16, 16)
    assert s.solution in "ABCD" and len(s.fields["options"]) == 4


def test_video_search_sampling_misses_the_flash_and_frames_finds_it(tmp_path):
    paths = GENERATORS.get("video_search")(tmp_path, n_train=3, n_eval=1, seed=0)
    colours = {"A": (220, 30, 30), "B": (30, 170, 60), "C": (40, 70, 220), "D": (230, 200, 30)}
    for s in load_samples(paths["train"]):
        first = load_video(s.videos[0], fps=0.5)  # data.video_fps of the recipe
        centre = first.frames[:, 26:30, 26:30].reshape(len(first), -1, 3).mean(1)
        # Every sampled frame shows white or the grey card, never a colour; the card is seen.
        assert np.abs(centre - centre.mean(-1, keepdims=True)).max() < 12
        assert (np.abs(centre - 128).max(-1) < 12).any()
        ctx = ToolContext(prompt=_prompt(s), input_sizes=[], images=[], videos=[s.videos[0]],
                          audios=[])
        video, caption = frames(ctx, *s.fields["card_span"], fps=4.0)
        seen = video.frames[:, 26:30, 26:30].reshape(len(video), -1, 3).mean(1)
        target = np.asarray(colours[s.solution])
        assert (np.abs(seen - target).max(-1) < 40).any(), caption
        assert video.fps == pytest.approx(4.0, rel=0.05)  # qwen-vl-utils: frames over the window


def _prompt(sample):
    from mmrl.types import PromptFeatures
    return PromptFeatures(sample=sample, tensors={})


def test_records_name_tools_and_keep_full_resolution_originals(tmp_path):
    base = {"id": "r", "prompt": "q", "solution": "A", "images": ["small.png"]}
    s = to_sample({**base, "tools": ["crop"], "full_images": ["big.png"]}, "f.jsonl:1", tmp_path)
    assert s.fields["tools"] == ["crop"]
    assert s.fields["full_images"] == [str(tmp_path / "big.png")]
    with pytest.raises(RecordError, match="f.jsonl:2: 'full_images' holds 2 paths for 1 images"):
        to_sample({**base, "full_images": ["a.png", "b.png"]}, "f.jsonl:2", tmp_path)
    with pytest.raises(RecordError, match="f.jsonl:3: 'tools' must be a list"):
        to_sample({**base, "tools": "crop"}, "f.jsonl:3", tmp_path)
    # A tool the run does not configure is an error naming the record, not a silent skip.
    box = Toolbox([load_tool("crop")])
    assert box.offered(s) == ["crop"]
    odd = to_sample({**base, "tools": ["frames"]}, "f.jsonl:4", tmp_path)
    with pytest.raises(ValueError, match="f.jsonl:4: the record offers tools \\['frames'\\]"):
        box.offered(odd)
    # Crop reads the original, not the model's copy (a real processor's grid gives the frame).
    from mmrl.models import get_adapter
    adapter = get_adapter("qwen2_5_vl")
    _, processor = adapter.tiny()
    Image.new("RGB", (56, 56), "white").save(tmp_path / "small.png")
    Image.new("RGB", (560, 560), "red").save(tmp_path / "big.png")
    with Image.open(tmp_path / "small.png") as small:
        prompt = adapter.prompt_features(processor, s, [small.convert("RGB")])
    ctx = box.context(prompt, Codec(adapter, processor))
    assert ctx.images == [str(tmp_path / "big.png")] and ctx.input_sizes == [(56, 56)]
    out = crop(ctx, [0, 0, 28, 28])[0]  # the top-left quarter of the 560-px original
    assert out.size == (280, 280) and out.getpixel((0, 0)) == (255, 0, 0)


def test_generators_are_deterministic(tmp_path):
    a = GENERATORS.get("visual_search")(tmp_path / "a", n_train=2, n_eval=1, seed=3)
    b = GENERATORS.get("visual_search")(tmp_path / "b", n_train=2, n_eval=1, seed=3)
    assert open(a["train"]).read().replace(str(tmp_path / "a"), "") == \
        open(b["train"]).read().replace(str(tmp_path / "b"), "")
    assert (tmp_path / "a/images/00000.png").read_bytes() == (tmp_path / "b/images/00000.png").read_bytes()


def test_video_search_seen_records_show_the_flash_at_first_look(tmp_path):
    """`seen=1`: every training record's flash lands on a sampled frame (held-out ones never);
    the first look at data.video_fps shows the colour. `card_at` places the card."""
    paths = video(tmp_path, n_train=2, n_eval=1, seed=0, seen=1.0,
                  seconds=8, fps=2, size=28, card_seconds=3,
                  flash_frames=1, card_at=[0.5, 4.5])
    train, held = list(load_samples(paths["train"])), list(load_samples(paths["eval"]))
    assert [s.fields["flash_seen"] for s in train + held] == [True, True, False]
    assert all(s.fields["card_span"][0] in (0.5, 4.5) for s in train + held)
    with pytest.raises(ValueError, match="a card at 6 s does not fit the 8 s clip"):
        video(tmp_path / "x", n_train=1, n_eval=0, seconds=8, fps=2,
              card_seconds=3, card_at=[6])
    for s in train:
        first = load_video(s.videos[0], fps=0.5)
        centre = first.frames[:, 13:15, 13:15].reshape(len(first), -1, 3).mean(1)
        assert np.abs(centre - centre.mean(-1, keepdims=True)).max() > 60  # a colour, not grey


def test_grid_places_the_patch_mid_cell_and_the_resized_box_holds_it(tmp_path):
    """grid=8 on a 448-px scene: 56-px cells, the 24-px patch 16 px in from the cell's corner; its
    box in the 56 x 56 input frame is the cell's middle, 7 px a cell, rounded outwards."""
    made = visual(tmp_path, n_train=20, n_eval=0, size=448, patch=24,
                  cell=1, grid=8)
    import json
    for line in open(made["train"]):
        r = json.loads(line)
        x1, y1, x2, y2 = r["patch_box"]
        assert x1 % 56 == 16 and y1 % 56 == 16 and (x2 - x1, y2 - y1) == (24, 24)
        assert r["patch_box_resized"] == [x1 // 8, y1 // 8, -(-x2 // 8), -(-y2 // 8)]
        assert r["patch_box_resized"][0] % 7 == 2 and r["patch_box_resized"][2] % 7 == 5
    with pytest.raises(ValueError, match="does not fit a cell"):
        visual(tmp_path / "x", n_train=1, n_eval=0, size=448, patch=64,
               cell=1, grid=8)


def test_video_search_answers_are_balanced_and_the_flash_can_fill_the_card(tmp_path):
    """Each split holds every colour as often (a constant answer scores 1/4, not a skewed
    majority); `flash_inset=0` colours the whole grey card for the flash frame."""
    from collections import Counter
    paths = video(tmp_path, n_train=8, n_eval=6, seed=1, seconds=8,
                  fps=2, size=28, card_seconds=3, flash_frames=1,
                  flash_inset=0)
    train, held = list(load_samples(paths["train"])), list(load_samples(paths["eval"]))
    assert Counter(s.solution for s in train) == {"A": 2, "B": 2, "C": 2, "D": 2}
    counts = Counter(s.solution for s in held)
    assert sum(counts.values()) == 6 and max(counts.values()) - min(counts.values()) <= 1
    colours = {"A": (220, 30, 30), "B": (30, 170, 60), "C": (40, 70, 220), "D": (230, 200, 30)}
    for s in train[:3]:
        clip = load_video(s.videos[0], fps=2.0)  # the clip's own rate: every frame
        k = round(s.fields["flash_span"][0] * 2)
        card = clip.frames[k, 8:20, 8:20].reshape(-1, 3).astype(float)  # the card is 7..21
        assert np.abs(card.mean(0) - colours[s.solution]).max() < 40
    with pytest.raises(ValueError, match=r"flash_inset must be in \[-7, 7\) for 28-px frames"):
        video(tmp_path / "x", n_train=1, n_eval=0, size=28, flash_inset=-8)


def test_video_search_can_balance_where_the_card_starts(tmp_path):
    """balance_card_at: each split's cards start at every card_at time as often (a look fixed on
    one half is right on exactly half the held-out records)."""
    from collections import Counter
    kw = dict(n_train=8, n_eval=6, seed=3, seconds=8, fps=2, size=28, card_seconds=3,
              flash_frames=1, card_at=[0, 4])
    paths = video(tmp_path / "b", balance_card_at=True, **kw)
    for split, n in (("train", 8), ("eval", 6)):
        starts = Counter(s.fields["card_span"][0] for s in load_samples(paths[split]))
        assert starts == {0.0: n // 2, 4.0: n // 2}, (split, starts)
    with pytest.raises(ValueError, match="balance_card_at needs card_at"):
        video(tmp_path / "x", n_train=1, n_eval=0, balance_card_at=True)


def test_visual_search_answers_are_balanced_and_the_mark_draws_the_answer(tmp_path):
    """Each split holds every pattern as often (a constant letter scores 1/4), and the mark in
    the original image is the pattern the solution names: its ink cells, read back pixel by
    pixel, are the pattern's."""
    from collections import Counter
    paths = visual(tmp_path, n_train=8, n_eval=6, seed=3, size=672,
                   patch=112, cell=1, budget_pixels=7056, grid=3)
    train, held = list(load_samples(paths["train"])), list(load_samples(paths["eval"]))
    assert Counter(s.solution for s in train) == {"A": 2, "B": 2, "C": 2, "D": 2}
    counts = Counter(s.solution for s in held)
    assert sum(counts.values()) == 6 and max(counts.values()) - min(counts.values()) <= 1
    names = sorted(PATTERNS)
    for s in train + held:
        with Image.open(s.images[0]) as im:
            x1, y1, _, _ = s.fields["mark_box"]
            ink = np.asarray(im)[y1:y1 + 4, x1:x1 + 4] == 2  # palette index 2: INK
        rule = PATTERNS[names["ABCD".index(s.solution)]]
        assert ink.tolist() == [[bool(rule(r, c)) for c in range(4)] for r in range(4)], s.id


def test_seen_records_show_what_the_crop_tool_returns_for_the_mark(tmp_path):
    """`seen`: a share of training records whose image is the view the crop tool returns for
    the demonstration's box (the record's mark_box_resized); held-out records never. Pixel for
    pixel against the real tool on the same scene drawn unseen."""
    kw = dict(n_train=12, n_eval=4, seed=5, size=672, patch=112, cell=1, budget_pixels=7056,
              grid=3)
    plain = {s.id: s for s in load_samples(visual(tmp_path / "a", **kw)
                                           ["train"])}
    paths = visual(tmp_path / "b", seen=0.5, **kw)
    train, held = list(load_samples(paths["train"])), list(load_samples(paths["eval"]))
    shown = [s for s in train if s.fields.get("mark_seen")]
    assert 0 < len(shown) < 12 and not any(s.fields.get("mark_seen") for s in held)
    for s in shown:
        assert "mark_box" not in s.fields and s.solution == plain[s.id].solution
        unseen = plain[s.id]
        with Image.open(unseen.images[0]) as im:
            ctx = context_for(im.convert("RGB"), unseen.images[0], 7056)
        ctx = dataclasses.replace(ctx, image_pixels=(7056, 7056))
        want = np.asarray(crop(ctx, unseen.fields["mark_box_resized"], coords="resized")[0])
        with Image.open(s.images[0]) as view:
            assert view.size == (84, 84) and np.array_equal(np.asarray(view.convert("RGB")), want)
    # The other training records are the unseen ones, unchanged.
    assert all(s.images[0].endswith(plain[s.id].images[0][-9:]) for s in train if s not in shown)


def test_video_search_can_hide_the_flash_from_a_look_at_the_whole_clip(tmp_path):
    """hide_from: the hidden flash also falls between the frames a `frames` call on the whole
    clip keeps (0-7.5 s at 2 fps, 8 frames: 0, 1, 2, 3, 4.5, 5.5, 6.5, 7.5 s), so only a look
    at the card's half (every frame, 0.5 s apart) shows its colour."""
    wide = {"fps": 2.0, "start": 0.0, "end": 7.5, "max_frames": 8}
    kw = dict(n_train=6, n_eval=6, seed=4, seconds=8, fps=2, size=28, card_seconds=3,
              flash_frames=1, flash_inset=-7, card_at=[0, 0.5, 1, 4, 4.5, 5])
    paths = video(tmp_path / "h", hide_from=[wide], **kw)
    colours = {"A": (220, 30, 30), "B": (30, 170, 60), "C": (40, 70, 220), "D": (230, 200, 30)}
    for s in load_samples(paths["eval"]):
        assert s.fields["flash_span"][0] in {0.5, 1.5, 3.5, 4.0, 6.0, 7.0}, s.fields
        ctx = ToolContext(prompt=_prompt(s), input_sizes=[], images=[], videos=[s.videos[0]],
                          audios=[])
        target = np.asarray(colours[s.solution])
        whole, _ = frames(ctx, 0, 7.5, fps=2.0, max_frames=8)
        half = 0.0 if s.fields["card_span"][1] <= 4 else 4.0
        tight, _ = frames(ctx, half, half + 3.5, fps=2.0, max_frames=8)
        for look, shows in ((whole, False), (tight, True)):
            mean = look.frames.reshape(len(look), -1, 3).mean(1)
            assert (np.abs(mean - target).max(-1) < 40).any() == shows, (s.fields, shows)
    with pytest.raises(ValueError, match="hide_from"):  # no frame escapes a look at every frame
        video(tmp_path / "x", n_train=1, n_eval=0, seconds=8, fps=2,
              size=28, card_seconds=2, flash_frames=1, card_at=[0],
              hide_from=[{"fps": 2.0}])


@pytest.mark.parametrize("task", ["visual_search", "video_search"])
def test_a_short_prompt_replaces_only_the_question_text(task, tmp_path):
    """`prompt`: the records' question text (a tiny model reads no English); the options, the
    solution, the media and every field stay those of the default draw."""
    kw = dict(n_train=2, n_eval=1, seed=3)
    if task == "video_search":
        kw.update(seconds=8, fps=2, size=28, card_seconds=3, flash_frames=1)
    long_ = SPEC_WRITERS[task](tmp_path / "a", **kw)
    short = SPEC_WRITERS[task](tmp_path / "b", **kw, prompt="Which?")
    for split in ("train", "eval"):
        a = [json.loads(x) for x in open(long_[split])]
        b = [json.loads(x) for x in open(short[split])]
        assert [r.pop("prompt") for r in b] == ["Which?"] * len(b)
        assert [r.pop("show_options") for r in b] == [False] * len(b)
        assert all("A. " in r.pop("prompt") for r in a) and a == b
    # what the model reads: the short prompt alone (the schema would list the options under it)
    from mmrl.data.schema import load_samples
    (sample, *_) = load_samples(short["train"], "mmrl")
    assert sample.messages[0]["content"][-1]["text"] == "Which?"
