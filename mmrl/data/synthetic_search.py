"""Search tasks that need a second look (registered into GENERATORS): `visual_search` (a small
mark in a large image) and `video_search` (a brief event in a long video).

Both are built so that the answer is NOT in what the model is first given and IS in what the
right tool call returns:

- visual_search: a yellow patch, visible at the model's input budget, holds a 4x4-cell pattern.
  Every pattern inks the same number of cells about the same centre, and at the budget the
  whole pattern is half an input pixel, so the downsampled images of the four answers are equal
  to within one level of 255 (tests/data/test_search_data.py measures it); a crop of the patch
  shows the cells at many pixels each.
- video_search: a grey card is on screen for a few seconds; inside that window a coloured flash
  lasts `flash_frames` native frames, placed between the frames that sampling at `sample_fps`
  (data.video_fps) keeps, so the sampled video never shows it; `frames` over the card's span at
  a higher fps does.

`tools=False` writes the same data as single-turn records without tools: the control rows, which
must stay at chance. The budgets (`budget_pixels`, `sample_fps`) must be the recipe's
data.image_max_pixels / data.video_fps, else the guarantee above does not hold.

The registered generators take what a recipe sets; `write_visual_search` / `write_video_search`
take a whole spec (VisualSearchSpec, VideoSearchSpec), with the variants the learning table's
rows tune (research/search_variants.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrl.data.media import enlarge, fit_image, fit_pixels, plan_frames
from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_av import COLORS, MC_LETTERS, mc_options, write_mp4, write_split

# 4x4-cell patterns, each inking 8 cells centred on the pattern's middle: equal ink and equal
# centroid, so a downsampling filter wider than the pattern gives the same pixels for each.
PATTERNS = {
    "horizontal bars": lambda r, c: r in (0, 3),
    "vertical bars": lambda r, c: c in (0, 3),
    "checkerboard": lambda r, c: (r + c) % 2 == 0,
    "two blocks": lambda r, c: (r < 2) == (c < 2),
}
BACKGROUND, PATCH_COLOUR, INK = (150, 150, 150), (235, 200, 40), (20, 20, 20)
# Scenes are palette images of these three colours: a 1792-px PNG saves in ~15 ms and < 1 KB
# (as RGB: ~130 ms and ~45 KB); readers get RGB (mmrl.data.media.load_image converts).
PALETTE = [*BACKGROUND, *PATCH_COLOUR, *INK]


def draw_pattern(draw: ImageDraw.ImageDraw, name: str, x0: int, y0: int, cell: int) -> list[int]:
    """Ink pattern `name` with its top-left at (x0, y0); -> its box [x1, y1, x2, y2]."""
    rule = PATTERNS[name]
    for r in range(4):
        for c in range(4):
            if rule(r, c):
                draw.rectangle([x0 + c * cell, y0 + r * cell, x0 + (c + 1) * cell - 1,
                                y0 + (r + 1) * cell - 1], fill=2)  # INK
    return [x0, y0, x0 + 4 * cell, y0 + 4 * cell]


def search_image(rng: random.Random, size: int, patch: int, cell: int,
                 pattern: str | None = None, grid: int = 0) -> tuple[Image.Image, dict]:
    """One scene: a grey field, the yellow patch somewhere (with `grid` > 0: centred in one
    cell of a grid x grid division of the scene), the pattern centred in it. Draws from `rng` in
    a fixed order, so the same rng state with another `pattern` gives the same scene with only
    the pattern changed (what the unreadability test compares). A plain field: noise would make
    each large PNG megabytes. The image is in palette mode (PALETTE)."""
    im = Image.new("P", (size, size), 0)
    im.putpalette(PALETTE)
    if grid:
        step = size // grid
        x, y = (rng.randrange(grid) * step + (step - patch) // 2 for _ in range(2))
    else:
        x, y = rng.randint(0, size - patch), rng.randint(0, size - patch)
    drawn = rng.choice(sorted(PATTERNS))
    pattern = pattern or drawn
    draw = ImageDraw.Draw(im)
    draw.rectangle([x, y, x + patch - 1, y + patch - 1], fill=1)  # PATCH_COLOUR
    offset = (patch - 4 * cell) // 2
    box = draw_pattern(draw, pattern, x + offset, y + offset, cell)
    return im, {"pattern": pattern, "mark_box": box, "patch_box": [x, y, x + patch, y + patch]}


@dataclass(frozen=True)
class VisualSearchSpec:
    """One visual_search draw. `visual_search` (the registered generator: `mmrl data generate`,
    the recipes) sets the fields down to `tools`; the three after them are layout variants the
    learning table's rows use (research/search_variants.py builds them)."""

    n_train: int = 400
    n_eval: int = 80
    seed: int = 0
    size: int = 1792
    patch: int = 96
    cell: int = 4
    budget_pixels: int = 56 * 56
    tools: bool = True
    # The patch in the middle of one cell of a grid x grid division (fewer places to look: a
    # coarse search); 0: anywhere.
    grid: int = 0
    # The share of TRAINING records whose image is already the view a crop of the mark returns
    # (`mark_view`, at the budget; `mark_seen` true, no boxes): reading practice without a
    # search, as video_search's seen flashes are. Held-out records never.
    seen: float = 0.0
    # The records' question text in place of the sentence, the lettered options and the answer
    # hint (the options stay in the "options" field): a short one for a model that reads no English.
    prompt: str | None = None


@GENERATORS.register("visual_search")
def visual_search(out_dir: str | Path, n_train: int = 400, n_eval: int = 80, seed: int = 0,
                  size: int = 1792, patch: int = 96, cell: int = 4, budget_pixels: int = 56 * 56,
                  tools: bool = True) -> dict[str, str]:
    """Which pattern does the yellow patch hold? (4-way multiple choice, letter solution, each
    split's answers balanced).
    At the input budget (`budget_pixels` = data.image_max_pixels; 56x56 for a 1792 image: 32x
    smaller) the 16-px pattern is half a pixel and the four answers' inputs differ by at most a
    level or two; a crop of the patch shows it. Fields: image_size,
    mark_box / patch_box (original pixels), mark_box_resized / patch_box_resized (the model's
    input frame), and "tools": ["crop"] unless tools=False."""
    return write_visual_search(out_dir, VisualSearchSpec(n_train, n_eval, seed, size, patch, cell,
                                                         budget_pixels, tools))


def write_visual_search(out_dir: str | Path, spec: VisualSearchSpec) -> dict[str, str]:
    """The records and images of `spec` in out_dir (train.jsonl, eval.jsonl, images/)."""
    n_train, n_eval, seed, size, patch, cell = (spec.n_train, spec.n_eval, spec.seed, spec.size,
                                                spec.patch, spec.cell)
    budget_pixels, grid, seen, prompt = spec.budget_pixels, spec.grid, spec.seen, spec.prompt
    w, h = fit_pixels(size, size, 28 * 28, budget_pixels)
    if 4 * cell * w / size > 0.5:
        raise ValueError(f"visual_search: the pattern ({4 * cell} px) would be "
                         f"{4 * cell * w / size:.1f} px at the {w}x{h} budget: readable without "
                         f"a crop; raise size or lower cell")
    if patch < 4 * cell + 2:
        raise ValueError("visual_search: patch must exceed the pattern (4 * cell)")
    if grid and patch > size // grid:
        raise ValueError(f"visual_search: a {patch}-px patch does not fit a cell of the "
                         f"{grid} x {grid} grid ({size // grid} px); lower grid or patch")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = sorted(PATTERNS)
    options = mc_options(names)
    # Each split's answers balanced (a constant answer scores chance, 1/4), drawn apart from the
    # scenes' rng: the scenes are those of an unbalanced draw, with the pattern swapped.
    pick = random.Random(f"visual_search answers {seed}")
    answers = balanced(pick, n_train, len(names)) + balanced(pick, n_eval, len(names))
    records = []
    for i in range(n_train + n_eval):
        im, scene = search_image(rng, size, patch, cell, pattern=names[answers[i]], grid=grid)
        name = f"images/{i:05d}.png"
        im.save(out / name)
        record = {
            "id": f"vs-{i:05d}", "task": "visual_search", "images": [name],
            "prompt": prompt or ("The yellow square holds a small pattern. Which pattern is it?\n"
                                 + "\n".join(options)
                                 + "\nAnswer with the option letter in <answer></answer>."),
            "solution": MC_LETTERS[names.index(scene["pattern"])], "options": options,
            **({"show_options": False} if prompt else {}),  # the short prompt stays short
            "problem_type": "multiple choice", "image_size": [size, size],
            "mark_box": scene["mark_box"], "patch_box": scene["patch_box"],
            # The patch and the mark in the model's input frame (w x h at the budget), rounded
            # outwards: Qwen2.5-VL's own box convention (`coords: resized`).
            **{f"{key}_resized": [math.floor(scene[key][0] * w / size),
                                  math.floor(scene[key][1] * h / size),
                                  math.ceil(scene[key][2] * w / size),
                                  math.ceil(scene[key][3] * h / size)]
               for key in ("patch_box", "mark_box")},
        }
        if i < n_train and seen > 0 and pick.random() < seen:  # its own rng: seen=0 as before
            view = f"images/{i:05d}_view.png"
            mark_view(im, record["mark_box_resized"], size / w, budget_pixels).save(out / view)
            record = {**{k: v for k, v in record.items()
                         if k not in ("mark_box", "patch_box", "mark_box_resized",
                                      "patch_box_resized")},
                      "images": [view], "image_size": [size, size], "mark_seen": True}
        if spec.tools:
            record["tools"] = ["crop"]
        records.append(record)
    return write_split(out, records, n_train)


def mark_view(image: Image.Image, box_resized: list[int], scale: float,
              budget_pixels: int, factor: int = 28) -> Image.Image:
    """What the crop tool returns for `box_resized` (the model's input frame, `scale` original
    pixels to one input pixel): that region of the original, grown to at least `factor` pixels a
    side (media.enlarge, the tool's own rule), fitted to the budget."""
    box = enlarge([v * scale for v in box_resized], factor, *image.size)
    return fit_image(image.convert("RGB").crop(box), budget_pixels, budget_pixels, factor=factor)


def balanced(rng: random.Random, n: int, k: int) -> list[int]:
    """`n` answers out of `k`, each as often as `n` allows (the remainder drawn), shuffled."""
    out = [i % k for i in range(n - n % k)] + rng.sample(range(k), n % k)
    rng.shuffle(out)
    return out


def flash_frames_missed(n_frames: int, native_fps: float, sample_fps: float, window: range,
                        length: int, rng: random.Random, hide_from: list[dict] = ()) -> int:
    """A first frame for a `length`-frame event inside `window` that sampling at `sample_fps`
    (qwen-vl-utils' rule, as data.video_fps decodes) never shows, nor any plan in `hide_from`
    (`plan_frames` keywords: another look's frames); ValueError when none fits."""
    kept = set(plan_frames(n_frames, native_fps, fps=sample_fps)[0])
    for look in hide_from:
        kept |= set(plan_frames(n_frames, native_fps, **look)[0])
    starts = [s for s in window if s + length <= window.stop
              and not kept & set(range(s, s + length))]
    if not starts:
        raise ValueError("video_search: no gap between sampled frames fits the flash; lower "
                         "sample_fps or flash_frames, or hide it from fewer looks (hide_from)")
    return rng.choice(starts)


@dataclass(frozen=True)
class VideoSearchSpec:
    """One video_search draw. `video_search` (the registered generator) sets the fields down to
    `tools`; the ones after them are variants the learning table's rows use
    (research/search_variants.py builds them)."""

    n_train: int = 200
    n_eval: int = 40
    seed: int = 0
    seconds: int = 16
    fps: int = 8
    size: int = 56
    sample_fps: float = 0.5
    card_seconds: int = 4
    flash_frames: int = 2
    tools: bool = True
    # The share of TRAINING records whose flash starts on a sampled frame instead (the first
    # look shows it: no search needed); held-out records never.
    seen: float = 0.0
    # The card's start times (seconds) to draw from (None: any frame); with balance_card_at,
    # each split's cards start at every one as often, in a shuffled order, instead of a draw
    # per record (so a look fixed on one half cannot pass or fail by the split).
    card_at: list[float] | None = None
    balance_card_at: bool = False
    # Pixels of grey card left around the flash on each side (0: the whole card flashes;
    # negative: the flash spreads past the card, and -size/4 fills the frame).
    flash_inset: int = 4
    # Other looks the hidden flash must also fall between, each as `plan_frames` keywords (fps,
    # start, end, max_frames: what a `frames` call over that span keeps), e.g.
    # [{"fps": 2, "start": 0, "end": 7.5, "max_frames": 8}] for a look at a whole 8 s clip.
    hide_from: list[dict] | None = None
    prompt: str | None = None  # the question text, as VisualSearchSpec's


@GENERATORS.register("video_search")
def video_search(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
                 seconds: int = 16, fps: int = 8, size: int = 56, sample_fps: float = 0.5,
                 card_seconds: int = 4, flash_frames: int = 2,
                 tools: bool = True) -> dict[str, str]:
    """What colour flashes while the grey card is shown? (4-way multiple choice.) A `seconds`
    long clip at `fps`; the card is on screen for `card_seconds`, long enough that sampling at
    `sample_fps` (= data.video_fps) sees it; the flash lasts `flash_frames` native frames and
    falls between sampled frames. Each split's answers are balanced (every colour as often, in a
    shuffled order), so a constant answer scores chance, not a skewed majority. Fields:
    duration, card_span and flash_span (seconds), flash_seen, and "tools": ["frames"] unless
    tools=False."""
    return write_video_search(out_dir, VideoSearchSpec(n_train, n_eval, seed, seconds, fps, size,
                                                       sample_fps, card_seconds, flash_frames,
                                                       tools))


def write_video_search(out_dir: str | Path, spec: VideoSearchSpec) -> dict[str, str]:
    """The records and clips of `spec` in out_dir (train.jsonl, eval.jsonl, videos/)."""
    n_train, n_eval, seed, seconds, fps, size = (spec.n_train, spec.n_eval, spec.seed,
                                                 spec.seconds, spec.fps, spec.size)
    sample_fps, card_seconds, flash_frames = spec.sample_fps, spec.card_seconds, spec.flash_frames
    seen, card_at, flash_inset, hide_from, prompt = (spec.seen, spec.card_at, spec.flash_inset,
                                                     spec.hide_from, spec.prompt)
    balance_card_at = spec.balance_card_at
    if card_seconds * sample_fps < 1:
        raise ValueError("video_search: card_seconds * sample_fps must be >= 1 (the card must be "
                         "in a sampled frame)")
    if not -(size // 4) <= flash_inset < size // 4:
        raise ValueError(f"video_search: flash_inset must be in [{-(size // 4)}, {size // 4}) for "
                         f"{size}-px frames (the card is the middle half)")
    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = list(COLORS)
    options = mc_options(names)
    n = seconds * fps
    answers = balanced(rng, n_train, len(names)) + balanced(rng, n_eval, len(names))
    if balance_card_at and not card_at:
        raise ValueError("video_search: balance_card_at needs card_at, the start times to balance")
    starts = (balanced(rng, n_train, len(card_at)) + balanced(rng, n_eval, len(card_at))
              if balance_card_at else None)
    records = []
    for i in range(n_train + n_eval):
        card = (rng.randrange(0, n - card_seconds * fps + 1) if card_at is None
                else round(card_at[starts[i]] * fps) if starts is not None
                else round(rng.choice(card_at) * fps))
        if not 0 <= card <= n - card_seconds * fps:
            raise ValueError(f"video_search: a card at {card / fps:g} s does not fit the "
                             f"{seconds} s clip (card_at, card_seconds)")
        window = range(card, card + card_seconds * fps)
        flash = flash_frames_missed(n, fps, sample_fps, window, flash_frames, rng,
                                    hide_from or ())
        shown = i < n_train and seen > 0 and rng.random() < seen
        if shown:  # drawn after the hidden start, so seen=0 gives the same records as before
            kept = [k for k in plan_frames(n, fps, fps=sample_fps)[0] if k in window]
            flash = min(rng.choice(kept), window.stop - flash_frames)
        colour = answers[i]
        frames = np.full((n, size, size, 3), 235, np.uint8)
        q = size // 4
        frames[window.start:window.stop, q:size - q, q:size - q] = 128
        inner = slice(q + flash_inset, size - q - flash_inset)
        frames[flash:flash + flash_frames, inner, inner] = \
            COLORS[names[colour]]
        name = f"videos/{i:05d}.mp4"
        write_mp4(out / name, frames, fps)
        record = {
            "id": f"vds-{i:05d}", "task": "video_search", "videos": [name],
            "prompt": prompt or ("A grey card appears, and while it is shown a colour flashes on "
                                 "it. Which colour?\n" + "\n".join(options)
                                 + "\nAnswer with the option letter in <answer></answer>."),
            "solution": MC_LETTERS[colour], "options": options,
            **({"show_options": False} if prompt else {}),  # the short prompt stays short
            "problem_type": "multiple choice", "duration": n / fps,
            "card_span": [window.start / fps, window.stop / fps],
            "flash_span": [flash / fps, (flash + flash_frames) / fps], "flash_seen": shown,
        }
        if spec.tools:
            record["tools"] = ["frames"]
        records.append(record)
    return write_split(out, records, n_train)
