"""Video-MME, as lmms-eval splits it: `videomme` (frames only) and `videomme_w_subtitle` (the
subtitles shown at 32 uniformly sampled frames, listed before the question). The options as the
dataset writes them ("A. ..."), "Answer with the option's letter from the given choices
directly." (with subtitles: "The best answer is:"); lmms-eval's robust letter extractor;
accuracy in percent, overall and per duration (short / medium / long).

The copy's layout is lmms-eval's cache: videomme/test-*.parquet, data/VIDEOID.mp4 (the Hub's
zip chunks unpacked), subtitle/VIDEOID.srt."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, chat, percent, write_parquet
from mmrl.types import Sample

OPTION_PROMPT = ("Select the best answer to the following multiple-choice question based on the "
                 "video and the subtitles. Respond with only the letter (A, B, C, or D) of the "
                 "correct option.")
POST = "\nAnswer with the option's letter from the given choices directly."
SUBTITLE_FRAMES = 32  # the task's frame_num: the frames whose subtitles are shown
_FONT = re.compile(r'<font color="white" size=".72c">(.*?)</font>')


def video_path(row: dict, root: Path) -> Path:
    base = root / "data" / f"{row['videoID']}.mp4"
    return next((p for p in (base, base.with_suffix(".MP4"), base.with_suffix(".mkv"))
                 if p.exists()), base)


def prompt(row: dict) -> str:
    return f"{OPTION_PROMPT}\n{row['question']}\n" + "\n".join(row["options"]) + f"\n{POST}"


def _seconds(stamp: str) -> float:
    h, m, rest = stamp.split(":")
    s, ms = rest.split(",")
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def _srt(path: Path) -> dict[tuple[float, float], str]:
    out = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = block.split("\n")
        if block.strip() and len(lines) >= 3:
            start, end = lines[1].split(" --> ")
            out[(_seconds(start), _seconds(end))] = " ".join(lines[2:])
    return out


def _fps_and_frames(path: Path) -> tuple[float, int]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return float(stream.average_rate), int(stream.frames)


def subtitle_text(row: dict, root: Path) -> str:
    """The subtitle lines on screen at 32 uniformly sampled frames (each once, in subtitle
    order), or "No subtitles available" without an .srt."""
    import numpy as np

    path = root / "subtitle" / f"{row['videoID']}.srt"
    if not path.exists():
        return "No subtitles available"
    fps, total = _fps_and_frames(video_path(row, root))
    spans = [(int(a * fps), int(b * fps), text) for (a, b), text in _srt(path).items()]
    frames = np.linspace(0, total - 1, SUBTITLE_FRAMES, dtype=int).tolist()
    shown = sorted({i for f in frames for i, s in enumerate(spans) if s[0] <= f < s[1]})
    return "\n".join(m[0] for i in shown if (m := _FONT.findall(spans[i][2])))


def prompt_with_subtitles(row: dict, root: Path) -> str:
    return (f"This video's subtitles are listed below: \n{subtitle_text(row, root)}\n"
            f"{OPTION_PROMPT}\n{row['question']}\n" + "\n".join(row["options"])
            + "\nThe best answer is:")


def _sample(row: dict, root: Path, source: str, text: str) -> Sample:
    return Sample(id=str(row["question_id"]), messages=chat(text, videos=1),
                  solution=row["answer"], task=row["duration"], source=source,
                  videos=[str(video_path(row, root))])


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return _sample(row, root, source, prompt(row))


def to_sample_subtitled(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return _sample(row, root, source, prompt_with_subtitles(row, root))


PHRASES = ["the answer is", "answer is", "the correct answer is", "correct answer is",
           "the best answer is", "best answer is", "the correct option is", "correct option is",
           "the best option is", "best option is", "the choice is", "choice is",
           "the correct choice is", "correct choice is", "i choose", "i select", "i pick",
           "my answer is", "my choice is", "옵션", "정답은", "답은", "답:",
           "答案是", "答案为", "选",
           "答えは"]
PRIORITY = {"start": 10, "end": 9, "phrase": 7, "parentheses": 6, "period": 5, "colon": 4,
            "right_paren": 3, "space": 2, "fallback": 0}


def extract_letter(response: str, letters: str = "ABCD") -> str:
    """lmms-eval's `extract_mcq_answer`: every format a letter appears in ("(A)", "A.", "A:",
    "A)", "A ", after "the answer is", leading, trailing; else anywhere), the highest-priority
    format wins, then the latest position; "" when no letter appears."""
    if not response or not response.strip():
        return ""
    text = response.strip()
    for char in [",", ".", "!", "?", ";", ":", "'", '"']:
        text = text.strip(char)
    text = " " + text + " "
    found = []
    for kind, form in (("parentheses", "({})"), ("period", "{}."), ("colon", "{}:"),
                       ("right_paren", "{})"), ("space", "{} ")):
        found += [(c, text.rfind(form.format(c)), kind) for c in letters if form.format(c) in text]
    lower = text.lower()
    for phrase in PHRASES:
        at = lower.find(phrase)
        if at != -1:
            found += [(c, text.find(c, at + len(phrase)), "phrase") for c in letters
                      if text.find(c, at + len(phrase)) != -1]
    bare = text.strip()
    found += [(c, 0, "start") for c in letters
              if bare.startswith(c) and (len(bare) == 1 or not bare[1].isalpha())]
    found += [(c, len(text) - 1, "end") for c in letters
              if bare.endswith(c) and (len(bare) == 1 or not bare[-2].isalpha())]
    if not found:
        found = [(c, text.rfind(c), "fallback") for c in letters if c in text]
    if not found:
        return ""
    found.sort(key=lambda x: (PRIORITY[x[2]], x[1]), reverse=True)
    return found[0][0]


def score(row: dict, text: str, ctx: Context) -> dict:
    pred = extract_letter(text)
    return {"pred_answer": pred, "duration": row["duration"],
            "score": float(pred.lower() == row["answer"].lower())}


def aggregate(rows: list[dict]) -> dict:
    out = {"accuracy": percent([r["score"] for r in rows]) if rows else 0}
    for d in ("short", "medium", "long"):
        sub = [r["score"] for r in rows if r["duration"] == d]
        if sub:
            out[f"accuracy/{d}"] = percent(sub)
    return out


def write_fixture(root: Path, n: int, seed: int) -> None:
    """videomme/test-00000-of-00001.parquet (video_id, duration, domain, sub_category, url,
    videoID, question_id, task_type, question, options ["A. ...", ...], answer), data/ID.mp4
    (2 s at 8 fps) and, for every other video, subtitle/ID.srt in the Hub's font-tag form."""
    import numpy as np

    from mmrl.data.synthetic_av import write_mp4

    rows = []
    for i in range(n):
        vid = f"fx{i:03d}"
        frames = np.random.default_rng(seed + i).integers(0, 255, (16, 32, 32, 3), dtype=np.uint8)
        (root / "data").mkdir(parents=True, exist_ok=True)
        write_mp4(root / "data" / f"{vid}.mp4", frames, 8)
        if i % 2 == 0:
            (root / "subtitle").mkdir(parents=True, exist_ok=True)
            (root / "subtitle" / f"{vid}.srt").write_text(
                f'1\n00:00:00,000 --> 00:00:00,900\n<font color="white" size=".72c">hello {i}'
                f'</font>\n\n2\n00:00:01,000 --> 00:00:01,800\n<font color="white" size=".72c">'
                f"bye {i}</font>\n\n")
        rows.append({"video_id": f"{i + 1:03d}", "duration": ["short", "medium", "long"][i % 3],
                     "domain": "Knowledge", "sub_category": "Humanity & History",
                     "url": f"https://www.youtube.com/watch?v={vid}", "videoID": vid,
                     "question_id": f"{i + 1:03d}-1", "task_type": "Counting Problem",
                     "question": f"How many squares appear in clip {i}?",
                     "options": [f"A. {i}", f"B. {i + 1}", f"C. {i + 2}", f"D. {i + 3}"],
                     "answer": "ABCD"[i % 4]})
    write_parquet(root / "videomme" / "test-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="videomme", title="Video-MME, video multiple choice (frames only)",
    hub="lmms-lab/Video-MME", lmms_task="videomme", files="videomme/test-*.parquet",
    metric="accuracy", to_sample=to_sample, score=score, aggregate=aggregate,
    write_fixture=write_fixture, max_new_tokens=16,
    notes="videos from data/VIDEOID.mp4 (unzip the Hub's videos_chunked_*.zip there)")
BENCHMARK_SUBTITLES = dataclasses.replace(
    BENCHMARK, name="videomme_w_subtitle", lmms_task="videomme_w_subtitle",
    title="Video-MME, video multiple choice with subtitles", to_sample=to_sample_subtitled,
    notes="subtitles from subtitle/VIDEOID.srt (unzip the Hub's subtitle.zip there)")
