"""Deterministic generators for tiny video / audio / image-grounding datasets (native schema).

Registered into `mmrl.data.synthetic.GENERATORS`: video_qa, temporal_grounding, asr, audio_qa,
audio_visual, detection, classification, captioning. Same arguments, same bytes (x264 runs
single-threaded; wav/png carry no timestamps), and 64 samples take well under 5 s. Each returns
{"train": path, "eval": path}, like `counting`.

The media writers (`write_mp4`, `write_wav`, `write_audio`) are public: tests build their assets
with them instead of checking binaries in.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrl.data.schema import write_jsonl
from mmrl.data.synthetic import GENERATORS

MC_LETTERS = "ABCD"
DIRECTIONS = ("left", "right", "up", "down")
COLORS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220),
          "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# DTMF keypad frequencies (Hz): each digit is a distinct (low, high) pair.
DTMF = {1: (697, 1209), 2: (697, 1336), 3: (697, 1477), 4: (770, 1209), 5: (770, 1336),
        6: (770, 1477), 7: (852, 1209), 8: (852, 1336), 9: (852, 1477), 0: (941, 1336)}


# ---------------------------------------------------------------------------- media writers ----

def write_mp4(path: str | Path, frames: np.ndarray, fps: int, *, audio: np.ndarray | None = None,
              sr: int = 16000, qp: int = 18) -> None:
    """H.264 (libx264, yuv420p) mp4 from [T, H, W, 3] uint8 frames (even H, W); optional mono
    float audio track (AAC).

    Reproducible bytes need a constant quantizer and one thread: with CRF rate control, the same
    frames encoded 40 times in one process gave 8 different files (libx264 in PyAV 18.1)."""
    import av

    frames = np.asarray(frames, dtype=np.uint8)
    t, h, w = frames.shape[:3]
    if h % 2 or w % 2:
        raise ValueError(f"write_mp4: yuv420p needs even sides, got {w}x{h}")
    with av.open(str(path), "w", format="mp4") as container:
        vs = container.add_stream("libx264", rate=int(fps),
                                  options={"qp": str(qp), "preset": "veryfast"})
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        vs.codec_context.thread_count = 1
        astream = None
        if audio is not None:
            astream = container.add_stream("aac", rate=sr)
            astream.layout = "mono"
        for k, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts = k
            for packet in vs.encode(vf):
                container.mux(packet)
        for packet in vs.encode():
            container.mux(packet)
        if astream is not None:
            _encode_audio(container, astream, np.asarray(audio, dtype=np.float32), sr)


def _encode_audio(container, stream, audio: np.ndarray, sr: int) -> None:
    import av

    x = audio[None, :] if audio.ndim == 1 else audio.T  # [channels, n]
    layout = "mono" if x.shape[0] == 1 else "stereo"
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x, dtype=np.float32), format="fltp",
                                       layout=layout)
    frame.sample_rate, frame.pts = sr, 0
    for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def write_audio(path: str | Path, audio: np.ndarray, sr: int, codec: str = "libmp3lame") -> None:
    """Compressed audio through PyAV: mp3 (libmp3lame) or m4a (aac). `audio` is [n] or [n, ch]."""
    import av

    audio = np.asarray(audio, dtype=np.float32)
    fmt = {"libmp3lame": "mp3", "aac": "mp4"}[codec]
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=sr)
        stream.layout = "mono" if audio.ndim == 1 else "stereo"
        _encode_audio(container, stream, audio, sr)


def write_wav(path: str | Path, audio: np.ndarray, sr: int) -> None:
    """16-bit PCM wav ([n] mono or [n, ch])."""
    import soundfile as sf

    sf.write(str(path), np.clip(np.asarray(audio, dtype=np.float32), -1, 1), sr, subtype="PCM_16")


def _tone(freqs: tuple[float, ...], seconds: float, sr: int, amp: float = 0.4) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    x = sum(np.sin(2 * np.pi * f * t) for f in freqs) * (amp / len(freqs))
    ramp = min(len(t) // 2, int(0.005 * sr))  # 5 ms fades: no clicks
    if ramp:
        env = np.ones_like(t)
        env[:ramp] = np.linspace(0, 1, ramp)
        env[-ramp:] = np.linspace(1, 0, ramp)
        x = x * env
    return x.astype(np.float32)


def _silence(seconds: float, sr: int) -> np.ndarray:
    return np.zeros(int(round(seconds * sr)), np.float32)


def write_split(out: Path, records: list[dict], n_train: int) -> dict[str, str]:
    write_jsonl(out / "train.jsonl", records[:n_train])
    write_jsonl(out / "eval.jsonl", records[n_train:])
    return {"train": str(out / "train.jsonl"), "eval": str(out / "eval.jsonl")}


def mc_options(choices) -> list[str]:
    return [f"{MC_LETTERS[i]}. {c}" for i, c in enumerate(choices)]


# ------------------------------------------------------------------------------------ video ----

@GENERATORS.register("video_qa")
def video_qa(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
             size: int = 56, square: int = 14, n_frames: int = 8, fps: int = 4,
             question: str = "direction") -> dict[str, str]:
    """4-way multiple-choice clips (Video-R1 style fields: problem_type, options, solution
    letter). `question`:
      "direction"     a coloured square moves left/right/up/down on white: which direction?
      "first_colour"  a square of one colour, then (from a random frame on) one of another:
                      which colour appears first? Both colours are in every clip, so without
                      their order the best answer is a coin toss between the two.
    """
    if square >= size or n_frames < 2 or question not in ("direction", "first_colour"):
        raise ValueError("video_qa: need square < size, n_frames >= 2 and question direction | "
                         "first_colour")
    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    draw = _moving_square if question == "direction" else _colour_order
    records = []
    for i in range(n_train + n_eval):
        frames, text, choices, answer = draw(rng, size, square, n_frames)
        name = f"videos/{i:05d}.mp4"
        write_mp4(out / name, frames, fps)
        options = mc_options(choices)
        records.append({
            "id": f"vqa-{i:05d}", "task": "video_qa", "videos": [name],
            "prompt": f"{text}\n" + "\n".join(options)
                      + "\nAnswer with the option letter in <answer></answer>.",
            "solution": MC_LETTERS[answer], "options": options,
            "problem_type": "multiple choice", "duration": n_frames / fps,
        })
    return write_split(out, records, n_train)


def _moving_square(rng: random.Random, size: int, square: int, n_frames: int):
    d = rng.randrange(4)
    color = COLORS[rng.choice(list(COLORS))]
    travel = size - square
    across = rng.randint(0, travel)  # fixed coordinate perpendicular to the motion
    frames = np.full((n_frames, size, size, 3), 255, np.uint8)
    for k in range(n_frames):
        along = round(k * travel / (n_frames - 1))
        pos = travel - along if DIRECTIONS[d] in ("left", "up") else along
        x, y = (pos, across) if DIRECTIONS[d] in ("left", "right") else (across, pos)
        frames[k, y:y + square, x:x + square] = color
    return frames, "Which direction does the square move?", DIRECTIONS, d


def _colour_order(rng: random.Random, size: int, square: int, n_frames: int):
    names = list(COLORS)
    first, second = rng.sample(range(len(names)), 2)
    switch = rng.randint(1, n_frames - 1)  # first frame of the second colour
    x, y = rng.randint(0, size - square), rng.randint(0, size - square)
    frames = np.full((n_frames, size, size, 3), 255, np.uint8)
    for k in range(n_frames):
        frames[k, y:y + square, x:x + square] = COLORS[names[first if k < switch else second]]
    return frames, "Which colour does the square have first?", names, first


@GENERATORS.register("temporal_grounding")
def temporal_grounding(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
                       size: int = 32, square: int = 12, fps: int = 4, min_seconds: int = 4,
                       max_seconds: int = 8, whole_seconds: bool = False) -> dict[str, str]:
    """Clips of min..max seconds in which a red square is visible from `start` to `end` (seconds,
    on frame boundaries, or on whole seconds with `whole_seconds`); solution [start, end], field
    duration."""
    if not 1 <= min_seconds <= max_seconds or square >= size:
        raise ValueError("temporal_grounding: need 1 <= min_seconds <= max_seconds, square < size")
    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_train + n_eval):
        n = rng.randint(min_seconds, max_seconds) * fps
        step = fps if whole_seconds else 1
        on = rng.randrange(0, n - fps + 1, step)  # visible for at least one second
        off = rng.randrange(on + fps, n + 1, step)
        x, y = rng.randint(0, size - square), rng.randint(0, size - square)
        frames = np.full((n, size, size, 3), 235, np.uint8)
        frames[on:off, y:y + square, x:x + square] = COLORS["red"]
        name = f"videos/{i:05d}.mp4"
        write_mp4(out / name, frames, fps)
        records.append({
            "id": f"tg-{i:05d}", "task": "temporal_grounding", "videos": [name],
            "prompt": "When does the red square appear? Answer with <answer>start to end</answer> "
                      "in seconds.",
            "solution": [round(on / fps, 2), round(off / fps, 2)], "duration": n / fps,
        })
    return write_split(out, records, n_train)


# ------------------------------------------------------------------------------------ audio ----

@GENERATORS.register("asr")
def asr(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
        min_digits: int = 3, max_digits: int = 6, sr: int = 16000) -> dict[str, str]:
    """DTMF-like tone sequences (0.15 s tone + 0.05 s gap per digit, 16 kHz wav); the transcript
    is the digits as words ("three one four")."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError("asr: need 1 <= min_digits <= max_digits")
    out = Path(out_dir)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_train + n_eval):
        digits = [rng.randrange(10) for _ in range(rng.randint(min_digits, max_digits))]
        parts = [_silence(0.1, sr)]
        for d in digits:
            parts += [_tone(DTMF[d], 0.15, sr), _silence(0.05, sr)]
        parts.append(_silence(0.05, sr))
        name = f"audio/{i:05d}.wav"
        write_wav(out / name, np.concatenate(parts), sr)
        records.append({
            "id": f"asr-{i:05d}", "task": "asr", "audios": [name],
            "prompt": "Transcribe the tone sequence: each tone is a digit. Answer with the digits "
                      "as words in <answer></answer>.",
            "solution": " ".join(DIGIT_WORDS[d] for d in digits),
            "duration": sum(len(p) for p in parts) / sr,
        })
    return write_split(out, records, n_train)


@GENERATORS.register("audio_qa")
def audio_qa(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
             sr: int = 16000) -> dict[str, str]:
    """1-4 beeps (0.15 s at 500-1500 Hz, 0.2 s gaps, 16 kHz wav); "How many beeps?" as a
    4-way multiple choice with a letter solution."""
    out = Path(out_dir)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    options = mc_options(["1", "2", "3", "4"])
    records = []
    for i in range(n_train + n_eval):
        count = rng.randint(1, 4)
        freq = rng.choice((500, 750, 1000, 1500))
        parts = [_silence(0.1, sr)]
        for _ in range(count):
            parts += [_tone((freq,), 0.15, sr), _silence(0.2, sr)]
        name = f"audio/{i:05d}.wav"
        write_wav(out / name, np.concatenate(parts), sr)
        records.append({
            "id": f"aqa-{i:05d}", "task": "audio_qa", "audios": [name],
            "prompt": "How many beeps are there?\n" + "\n".join(options)
                      + "\nAnswer with the option letter in <answer></answer>.",
            "solution": MC_LETTERS[count - 1], "options": options,
            "problem_type": "multiple choice", "duration": sum(len(p) for p in parts) / sr,
        })
    return write_split(out, records, n_train)


@GENERATORS.register("audio_visual")
def audio_visual(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
                 size: int = 56, square: int = 24, n_frames: int = 8, fps: int = 4,
                 sr: int = 16000) -> dict[str, str]:
    """A clip of a red or blue square with a soundtrack of one or two beeps (AAC in the mp4, which
    the record lists as its video and as its audio); "What colour, how many beeps?" as a 4-way
    multiple choice: only the frames tell the colour and only the sound the count."""
    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    colours, counts = ("red", "blue"), ("one beep", "two beeps")
    options = mc_options([f"{c}, {n}" for c in colours for n in counts])
    records = []
    for i in range(n_train + n_eval):
        colour, beeps = rng.randrange(2), rng.randrange(2)
        x, y = rng.randint(0, size - square), rng.randint(0, size - square)
        frames = np.full((n_frames, size, size, 3), 235, np.uint8)
        frames[:, y:y + square, x:x + square] = COLORS[colours[colour]]
        parts = [_silence(0.1, sr)]
        for _ in range(beeps + 1):
            parts += [_tone((rng.choice((500, 1000)),), 0.15, sr), _silence(0.2, sr)]
        video = f"videos/{i:05d}.mp4"
        write_mp4(out / video, frames, fps, audio=np.concatenate(parts), sr=sr)
        records.append({
            "id": f"av-{i:05d}", "task": "audio_visual", "videos": [video], "audios": [video],
            "prompt": "What colour is the square, and how many beeps are there?\n"
                      + "\n".join(options) + "\nAnswer with the option letter in <answer></answer>.",
            "solution": MC_LETTERS[2 * colour + beeps], "options": options,
            "problem_type": "multiple choice", "duration": n_frames / fps,
        })
    return write_split(out, records, n_train)


def paint_falling(folder: str | Path, n: int = 120, seed: int = 0, size: int = 112,
                  frames: int = 8, fps: int = 4) -> list[Path]:
    """`n` clips of a ball dropping from the top of the frame to the bottom over a plain
    background (random colours and column): a stand-in for a folder of the user's own videos,
    where time has a direction (things fall), which the `temporal_jigsaw` pretext task needs.
    H.264 mp4, deterministic."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        back = tuple(rng.randint(150, 255) for _ in range(3))
        ball = tuple(rng.randint(0, 110) for _ in range(3))
        r = size // 5  # 22 px at 112: two 14-px patches across once resized to 56
        cx = rng.randint(r, size - r)
        clip = []
        for t in range(frames):
            im = Image.new("RGB", (size, size), back)
            cy = r + (size - 2 * r) * t // (frames - 1)
            ImageDraw.Draw(im).ellipse([cx - r, cy - r, cx + r, cy + r], fill=ball)
            clip.append(np.asarray(im))
        paths.append(folder / f"clip_{i:04d}.mp4")
        write_mp4(paths[-1], np.stack(clip), fps)
    return paths

# ------------------------------------------------------------------------------------ image ----

def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: list[int], color) -> None:
    x0, y0, x1, y1 = box
    if shape == "square":
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=color)
    elif shape == "circle":
        draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=color)
    else:
        draw.polygon([((x0 + x1 - 1) / 2, y0), (x0, y1 - 1), (x1 - 1, y1 - 1)], fill=color)


def _scene(rng: random.Random, size: int, objects: list[tuple[str, str]], lo: int, hi: int,
           cells: int = 2):
    """White image with one object per cell of a `cells` x `cells` grid: [(shape, colour)] ->
    (image, boxes)."""
    im = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(im)
    cell = size // cells
    boxes = []
    for (shape, color), q in zip(objects, rng.sample(range(cells * cells), len(objects))):
        side = rng.randint(lo, min(hi, cell))
        x0 = (q % cells) * cell + rng.randint(0, cell - side)
        y0 = (q // cells) * cell + rng.randint(0, cell - side)
        box = [x0, y0, x0 + side, y0 + side]
        _draw_shape(draw, shape, box, COLORS[color])
        boxes.append(box)
    return im, boxes


@GENERATORS.register("detection")
def detection(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
              size: int = 56, min_side: int = 12, max_side: int = 20,
              cells: int = 2) -> dict[str, str]:
    """A red square among 1-2 distractors (other shapes or colours), one object per cell of a
    `cells` x `cells` grid; referring expression "the red square", solution its box
    [x1, y1, x2, y2] in pixels (x2, y2 exclusive)."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    distractors = [(s, c) for s in SHAPES for c in COLORS if (s, c) != ("square", "red")]
    records = []
    for i in range(n_train + n_eval):
        objects = [("square", "red")] + rng.sample(distractors, rng.randint(1, 2))
        im, boxes = _scene(rng, size, objects, min_side, max_side, cells)
        name = f"images/{i:05d}.png"
        im.save(out / name)
        records.append({
            "id": f"det-{i:05d}", "task": "detection", "images": [name],
            "prompt": "Locate the red square. Answer with its bounding box as "
                      "<answer>[x1, y1, x2, y2]</answer> in pixels.",
            "solution": boxes[0], "image_size": [size, size],
            "objects": [{"label": f"{c} {s}", "box": b} for (s, c), b in zip(objects, boxes)],
        })
    return write_split(out, records, n_train)


@GENERATORS.register("classification")
def classification(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
                   size: int = 56, min_side: int = 14, max_side: int = 22,
                   max_shapes: int = 3) -> dict[str, str]:
    """1-`max_shapes` distinct shapes (circle, square, triangle) in random colours; solution the
    set present as a sorted comma-separated list ("circle, square"). With 3, listing every shape
    without looking scores Jaccard 2/3 on average; with 2, 1/2."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = []
    for i in range(n_train + n_eval):
        shapes = rng.sample(SHAPES, rng.randint(1, max_shapes))
        objects = [(s, rng.choice(list(COLORS))) for s in shapes]
        im, _ = _scene(rng, size, objects, min_side, max_side)
        name = f"images/{i:05d}.png"
        im.save(out / name)
        records.append({
            "id": f"cls-{i:05d}", "task": "classification", "images": [name],
            "prompt": "Which shapes are in the image? Choose from circle, square, triangle. Answer "
                      "with a comma-separated list in <answer></answer>.",
            "solution": ", ".join(sorted(shapes)), "labels": list(SHAPES),
        })
    return write_split(out, records, n_train)


@GENERATORS.register("captioning")
def captioning(out_dir: str | Path, n_train: int = 200, n_eval: int = 40, seed: int = 0,
               size: int = 56, min_side: int = 14, max_side: int = 22) -> dict[str, str]:
    """1-2 coloured shapes; the reference caption names them left to right, then top to bottom
    ("a red circle and a blue square")."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pairs = [(s, c) for s in SHAPES for c in COLORS]
    records = []
    for i in range(n_train + n_eval):
        objects = rng.sample(pairs, rng.randint(1, 2))
        im, boxes = _scene(rng, size, objects, min_side, max_side)
        name = f"images/{i:05d}.png"
        im.save(out / name)
        ordered = [o for _, o in sorted(zip([(b[0], b[1]) for b in boxes], objects))]
        records.append({
            "id": f"cap-{i:05d}", "task": "captioning", "images": [name],
            "prompt": "Describe the image in a short phrase in <answer></answer>.",
            "solution": " and ".join(f"a {c} {s}" for s, c in ordered),
        })
    return write_split(out, records, n_train)
