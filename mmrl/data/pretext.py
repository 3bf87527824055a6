"""Self-supervised pieces built from the user's own media: frame shuffling (for T-GRPO,
Video-R1) and the pretext-task generators of `mmrl data generate` (rotation, patch_jigsaw,
temporal_jigsaw, clip_counting; `source=FOLDER` names the user's images or videos)."""
from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.data.media import Video, load_video
from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_av import MC_LETTERS, mc_options, write_split, write_mp4


def frame_permutation(n: int, seed: int) -> list[int]:
    """A seeded permutation of range(n) that is not the identity (for n >= 2): a "shuffled"
    video identical to the original would contrast nothing."""
    if n < 2:
        return list(range(n))
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n).tolist()
        if perm != list(range(n)):
            return perm


def shuffle_frames(video: Video, seed: int) -> Video:
    """The same video with its frames in a seeded non-identity order. Timestamps, fps and
    duration stay: the model sees frames at the same times, with the content reordered."""
    perm = frame_permutation(len(video), seed)
    return dataclasses.replace(video, frames=np.ascontiguousarray(video.frames[perm]))


# ------------------------------------------------------------ pretext tasks from raw media -----
# Verifiable tasks built from a folder of the user's own images or videos (Spatial-SSRL, SSL4RL,
# VideoSSR): the transformation applied is the label, so no annotation is needed. Each record
# names the reward that checks it in docs/methods.md.
IMAGE_EXT = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
VIDEO_EXT = (".mp4", ".mkv", ".mov", ".avi", ".webm")
ROTATIONS = (0, 90, 180, 270)


def _media_files(folder: str | Path, exts: tuple[str, ...], what: str) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"pretext: source folder {root} does not exist")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in exts)
    if not files:
        raise ValueError(f"pretext: no {what} ({', '.join(exts)}) under {root}")
    return files


def _open_image(path: Path, size: int) -> Image.Image:
    try:
        return Image.open(path).convert("RGB").resize((size, size))
    except OSError as e:
        raise ValueError(f"pretext: cannot read image {path}: {e}") from None


def _images(out_dir, source, n_train, n_eval, seed, size, make) -> dict[str, str]:
    files = _media_files(source, IMAGE_EXT, "images")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_train + n_eval):
        src = files[i % len(files)]
        im, record = make(_open_image(src, size), rng)
        name = f"images/{i:05d}.png"
        im.save(out / name)
        records.append({"id": f"{record['task']}-{i:05d}", "images": [name], "source": str(src),
                        "image_size": [size, size], **record})
    return write_split(out, records, n_train)


@GENERATORS.register("rotation")
def rotation(out_dir: str | Path, source: str = "", n_train: int = 200, n_eval: int = 40,
             seed: int = 0, size: int = 112) -> dict[str, str]:
    """Each image rotated by 0/90/180/270 degrees clockwise; 4-way multiple choice (reward:
    accuracy)."""
    options = mc_options([f"{r} degrees" for r in ROTATIONS])

    def make(im, rng):
        k = rng.randrange(4)
        prompt = ("By how many degrees clockwise was this image rotated?\n" + "\n".join(options)
                  + "\nAnswer with the option letter in <answer></answer>.")
        return im.rotate(-ROTATIONS[k]), {"task": "rotation", "prompt": prompt,
                                          "solution": MC_LETTERS[k], "options": options}
    return _images(out_dir, source, n_train, n_eval, seed, size, make)


@GENERATORS.register("patch_jigsaw")
def patch_jigsaw(out_dir: str | Path, source: str = "", n_train: int = 200, n_eval: int = 40,
                 seed: int = 0, size: int = 112, grid: int = 2) -> dict[str, str]:
    """Each image cut into grid x grid tiles, shuffled. The answer lists, for every position of
    the shuffled image in reading order, the original tile number (1-based) now there
    (reward: order)."""
    if size % grid:
        raise ValueError(f"patch_jigsaw: size {size} must be a multiple of grid {grid}")
    tile, n = size // grid, grid * grid

    def make(im, rng):
        perm = rng.sample(range(n), n)  # the identity too: "in order" is an answer to find
        out = Image.new("RGB", (size, size))
        for pos, src in enumerate(perm):
            box = ((src % grid) * tile, (src // grid) * tile)
            out.paste(im.crop((*box, box[0] + tile, box[1] + tile)),
                      ((pos % grid) * tile, (pos // grid) * tile))
        prompt = (f"This image was cut into {n} tiles, numbered 1 to {n} in reading order, and "
                  f"the tiles were shuffled. For each position of the shown image in reading "
                  f"order, give the number of the original tile there, e.g. "
                  f"<answer>{','.join(str(k + 1) for k in range(n))}</answer>.")
        return out, {"task": "patch_jigsaw", "prompt": prompt, "solution": [p + 1 for p in perm]}
    return _images(out_dir, source, n_train, n_eval, seed, size, make)


def _video_frames(path: Path, n: int, size: int) -> np.ndarray:
    frames = load_video(str(path), nframes=n, max_frames=max(n, 2)).frames
    if len(frames) < n:
        raise ValueError(f"pretext: {path} gave {len(frames)} frames, {n} needed (a longer video, "
                         f"or fewer clips / frames_per_clip)")
    return np.stack([np.asarray(Image.fromarray(f).resize((size, size))) for f in frames[:n]])


def _videos(out_dir, source, n_train, n_eval, seed, make) -> dict[str, str]:
    files = _media_files(source, VIDEO_EXT, "videos")
    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_train + n_eval):
        frames, fps, record = make(files, i, rng)
        name = f"videos/{i:05d}.mp4"
        write_mp4(out / name, frames, fps)
        records.append({"id": f"{record['task']}-{i:05d}", "videos": [name],
                        "duration": len(frames) / fps, **record})
    return write_split(out, records, n_train)


@GENERATORS.register("temporal_jigsaw")
def temporal_jigsaw(out_dir: str | Path, source: str = "", n_train: int = 100, n_eval: int = 20,
                    seed: int = 0, clips: int = 4, frames_per_clip: int = 2, size: int = 56,
                    fps: int = 2) -> dict[str, str]:
    """Each video cut into `clips` equal clips, shuffled; the answer lists, for every clip shown
    in order, its original number (1-based) (reward: order)."""
    def make(files, i, rng):
        src = files[i % len(files)]
        frames = _video_frames(src, clips * frames_per_clip, size)
        parts = np.split(frames[: clips * frames_per_clip], clips)
        # Any order, the identity included: with frame_permutation (never the identity, which
        # T-GRPO needs) two clips were always "2,1", a constant answer needing no look.
        perm = rng.sample(range(clips), clips)
        prompt = (f"This video was cut into {clips} equal clips, numbered 1 to {clips} in time "
                  f"order, and the clips were shuffled. For each clip shown, in order, give its "
                  f"original number, e.g. <answer>{','.join(str(k + 1) for k in range(clips))}"
                  f"</answer>.")
        return (np.concatenate([parts[p] for p in perm]), fps,
                {"task": "temporal_jigsaw", "prompt": prompt, "solution": [p + 1 for p in perm],
                 "source": str(src)})
    return _videos(out_dir, source, n_train, n_eval, seed, make)


@GENERATORS.register("clip_counting")
def clip_counting(out_dir: str | Path, source: str = "", n_train: int = 100, n_eval: int = 20,
                  seed: int = 0, max_clips: int = 4, frames_per_clip: int = 2, size: int = 56,
                  fps: int = 2, align: int = 1, phase: int = 0) -> dict[str, str]:
    """1..max_clips clips (max_clips >= 2), each from a different place (another video, or
    another part of the same one), joined; the answer is the number of clips (reward: count).
    Every video has max_clips x frames_per_clip frames, split into clips of near-equal length:
    with a fixed length per clip the frame count (and the duration) gave the answer away.
    `align=2` puts every cut on a multiple of 2 frames: Qwen-VL's video encoders merge each 2
    frames into one temporal patch, so a video read at its own fps then has no patch that blends
    two clips. `phase` shifts the cuts off that grid: with align=2, phase=1 every cut falls
    inside a temporal patch (at an odd frame), so each cut blends one patch, and the clips are
    as near-equal as that allows (3 clips of 6 frames: 1+2+3 or 3+2+1). The record's `cuts`
    lists the frame each clip after the first starts at."""
    total = max_clips * frames_per_clip
    if max_clips < 2:
        raise ValueError("clip_counting: max_clips must be >= 2")
    if align < 1 or total % align or total // align < max_clips:
        raise ValueError(f"clip_counting: {max_clips} clips x {frames_per_clip} frames = {total} "
                         f"frames cannot be cut into {max_clips} clips on multiples of align="
                         f"{align} (align=1 for cuts anywhere, or raise frames_per_clip)")
    if not 0 <= phase < align:
        raise ValueError(f"clip_counting: phase={phase} must be in 0..align-1 (align={align})")
    units = total // align

    def make(files, i, rng):
        n = rng.randint(1, max_clips)
        lengths = (_phased_lengths(total, n, align, phase, rng) if phase else
                   [(units // n + (k < units % n)) * align for k in range(n)])
        parts, prev = [], None
        for length in lengths:
            while True:  # neighbouring clips come from different places, or the cut is invisible
                src, start = files[rng.randrange(len(files))], rng.randint(0, total - length)
                if prev is None or (src != prev[0] if len(files) > 1
                                    else abs(start - prev[1]) >= length):
                    break
            prev = (src, start)
            parts.append(_video_frames(src, total, size)[start:start + length])
        prompt = ("This video joins several clips cut from different places. How many clips are "
                  "there? Answer with <answer>N</answer>.")
        cuts = np.cumsum(lengths)[:-1].tolist()
        return np.concatenate(parts), fps, {"task": "clip_counting", "prompt": prompt,
                                            "solution": str(n), "cuts": cuts}
    return _videos(out_dir, source, n_train, n_eval, seed, make)


def _phased_lengths(total: int, n: int, align: int, phase: int, rng: random.Random) -> list[int]:
    """Clip lengths for `n` clips of `total` frames whose cuts all fall on frames = phase (mod
    align): the nearest-equal such split, drawn among ties."""
    spots = range(phase, total, align)  # total // align of them (phase >= 1): enough, as checked
    splits = [[b - a for a, b in zip((0, *cut), (*cut, total))]
              for cut in itertools.combinations(spots, n - 1)]
    spread = min(max(s) - min(s) for s in splits)
    return rng.choice([s for s in splits if max(s) - min(s) == spread])
