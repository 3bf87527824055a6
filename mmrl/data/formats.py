"""Adapters from the anchor projects' record formats to Sample, registered in `FORMATS`.

Each adapter is `fn(record, source, base_dir) -> Sample`, so `data.format: video_r1` reads the
anchor's files as they are. `convert(fmt, in_path, out_path)` writes the same Samples as native
JSONL (what `mmrl data convert --from FORMAT IN OUT` runs).

    vlm_r1     LLaVA-style {"image": path | [paths], "conversations": [{"from": "human", "value":
               "<image>Q"}, {"from": "gpt", "value": "A"}], "accu_reward_method"?}  (om-ai-lab/VLM-R1)
    r1v        {"problem", "solution": "<answer> 3 </answer>", "image"}  (Deep-Agent/R1-V; Visual-RFT's
               [{"Position": [...], "Confidence": c}] solutions are detection)
    easyr1     {"problem", "answer", "images": [...], "videos": [...]}   (hiyouga/EasyR1)
    video_r1   {"problem_type", "problem", "options", "solution": "<answer>B</answer>", "path",
               "data_type": "image" | "video"}                            (tulerfeng/Video-R1)
    r1_aqa     {"audio_path", "question_text", "multi_choice", "answer": 0-based index} and MMAU
               {"audio_id", "question", "choices", "answer": text, "task"} (xiaomi-research/r1-aqa)
    time_r1    {"video", "duration", "timestamp": [s, e], "sentence", "video_start"?, "video_end"?}
               (Time-R1); "timestamps"/"sentences"; Charades-style dicts per video (schema.py)

The task of a sample is its reward route (`rewards[].tasks`): VLM-R1's accu_reward_method and
Video-R1's problem_type map onto it (ACCU_METHOD_TASKS, PROBLEM_TASKS). Box answers get
`image_size` = [w, h] from the image header, which box rewards need for model coordinates.

Normalisation: `<answer>` wrappers are stripped; multiple-choice solutions become one letter
(from a letter, a 0-based index, or the option's text); boxes and segments become number lists
(whole numbers stay ints).
Media placeholders (<image>, <video>, <audio>) in the text mark where each item goes; items with
no placeholder go first. Embedded media (HF/parquet image bytes, PIL images) are written once to
a content-addressed folder (record_parts.embedded_dir; `convert` writes them next to its output).
The answer format is appended to the question when the text does not already ask for <answer>
tags. Malformed records raise RecordError naming file:line. The record parts every adapter reads
(text, media references, options, numbers) are in record_parts.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mmrl.data.chat import read_chat
from mmrl.data.record_parts import (answer_letter, check_dict, embedding_into, fail,
                                      is_boxes, lettered_options, make_sample, media_ref,
                                      media_refs, numbers, passthrough, text_of, unwrap,
                                      with_hint, with_image_size)
from mmrl.data.schema import FORMATS, MEDIA_KINDS, load_samples, with_options
from mmrl.types import Sample

# VLM-R1 accu_reward_method -> task (others, e.g. "math", "yes_no", are the task as they are;
# "default" derives it from the answer).
ACCU_METHOD_TASKS = {"iou": "detection", "od": "detection", "od_ap": "detection",
                     "odLength": "detection", "mcq": "multiple_choice", "default": None}
# Video-R1 problem_type -> the sample's task, which `rewards[].tasks` routes on (docs/rewards.md).
PROBLEM_TASKS = {"multiple choice": "multiple_choice", "numerical": "numerical", "OCR": "ocr",
                 "free-form": "free_form", "regression": "regression"}
HINTS = {
    "multiple choice": "Answer with the option letter in <answer></answer>.",
    "numerical": "Answer with the number in <answer></answer>.",
    "regression": "Answer with the number in <answer></answer>.",
    "OCR": "Answer with the transcribed text in <answer></answer>.",
    "free-form": "Answer in <answer></answer>.",
}
TIME_HINT = "Answer with <answer>start to end</answer> in seconds."

# ---------------------------------------------------------------------------------- adapters ----

@FORMATS.register("vlm_r1")
def vlm_r1(record: Any, source: str, base_dir: Path) -> Sample:
    """LLaVA / InternVL conversations, by the chats' one rule (mmrl/data/chat.py): the last gpt
    turn is the answer, earlier rounds are the prompt's history. A 4-number answer is a box
    (task "detection"), anything else stays text (task "vqa")."""
    record = check_dict(record, source)
    turns = record.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise fail(source, "'conversations' must be a list of {from, value} turns")
    if not any(t.get("from") in ("human", "user") and isinstance(t.get("value"), str)
               for t in turns):
        raise fail(source, "no human turn with a 'value' string in 'conversations'")
    if turns[-1].get("from") not in ("gpt", "assistant") or turns[-1].get("value") in (None, ""):
        raise fail(source, "no gpt turn (the answer) at the end of 'conversations'")
    media = {"images": media_refs(record, ("image", "images"), base_dir, source),
             "videos": media_refs(record, ("video", "videos"), base_dir, source), "audios": []}
    messages, answer, media = read_chat({"conversations": turns}, source, base_dir, media)
    box = numbers(answer, None, source, "box")
    solution = box if box is not None and len(box) == 4 else answer
    fields = passthrough(record, {"id", "task", "conversations", "image", "images", "video",
                                   "videos"})
    # VLM-R1's per-record reward choice is the task that `rewards[].tasks` routes on.
    route = ACCU_METHOD_TASKS.get(record.get("accu_reward_method"), record.get("accu_reward_method"))
    task = str(route) if route else ("detection" if isinstance(solution, list) else "vqa")
    return Sample(id=str(record.get("id") or source), messages=messages, solution=solution,
                  task=str(record.get("task") or task), images=media["images"],
                  videos=media["videos"], audios=[], source=source,
                  fields=with_image_size(fields, solution, media["images"]))


def _r1v_like(record: Any, source: str, base_dir: Path) -> Sample:
    """R1-V / EasyR1 rows: question in 'problem' (or 'prompt'/'question'; EasyR1's <image> marks
    where images go), answer in 'answer' or 'solution' (<answer> tags stripped; a 4-number answer
    is a box), media in 'images'/'image', 'videos'/'video', 'audios'/'audio'."""
    record = check_dict(record, source)
    text = with_options(text_of(record, ("problem", "prompt", "question"), source, "question"),
                        record, source)
    if record.get("answer") is not None:
        raw = record["answer"]
    elif record.get("solution") is not None:
        raw = record["solution"]
    else:
        raise fail(source, "missing 'answer' or 'solution'")
    box = numbers(raw, None, source, "box") if not isinstance(raw, (int, float)) else None
    solution = box if box is not None and len(box) == 4 else unwrap(raw)
    if isinstance(solution, (int, float)) and not isinstance(solution, bool):
        solution = str(solution)
    media = {"images": media_refs(record, ("images", "image"), base_dir, source),
             "videos": media_refs(record, ("videos", "video"), base_dir, source),
             "audios": media_refs(record, ("audios", "audio"), base_dir, source)}
    boxes = is_boxes(solution)  # a box, or Visual-RFT's [{"Position": [...], ...}] list
    task = "detection" if boxes else ("video_qa" if media["videos"] else "vqa")
    fields = passthrough(record, {"id", "task", "problem", "prompt", "question", "answer",
                                   "solution", "images", "image", "videos", "video", "audios",
                                   "audio"})
    return make_sample(record, source, text=text, media=media, solution=solution, task=task,
                   fields=with_image_size(fields, solution, media["images"]))


FORMATS.add("r1v", _r1v_like)
FORMATS.add("easyr1", _r1v_like)


@FORMATS.register("video_r1")
def video_r1(record: Any, source: str, base_dir: Path) -> Sample:
    """Video-R1 rows: data_type picks image or video for 'path'; multiple choice gets its options
    listed under the question and a letter solution; the type's answer format is appended."""
    record = check_dict(record, source)
    problem = text_of(record, ("problem", "question"), source, "question")
    ptype = record.get("problem_type") or "free-form"
    dtype = record.get("data_type") or ("video" if record.get("video") else "image")
    if dtype not in ("image", "video"):
        raise fail(source, f"data_type must be 'image' or 'video', got {dtype!r}")
    if ptype not in PROBLEM_TASKS:
        raise fail(source, f"problem_type must be one of {sorted(PROBLEM_TASKS)}, got {ptype!r}")
    if record.get("solution") is None:
        raise fail(source, "missing 'solution'")
    fields = passthrough(record, {"problem", "question", "solution", "path", "image", "video",
                                   "options", "task", "id", "problem_id"})
    fields.update(problem_type=ptype, data_type=dtype)
    if ptype == "multiple choice":
        options = lettered_options(record.get("options"), source)
        solution = answer_letter(record["solution"], options, source)
        problem = f"{problem.rstrip()}\nOptions:\n" + "\n".join(options)
        fields["options"] = options
    else:
        solution = str(unwrap(record["solution"]))
    key = "videos" if dtype == "video" else "images"
    media = {key: media_refs(record, ("path", dtype), base_dir, source)}
    if not media[key]:
        raise fail(source, f"missing 'path' to the {dtype}")
    return make_sample(record, source, text=with_hint(problem, HINTS.get(ptype, HINTS["free-form"])),
                   media=media, solution=solution, task=PROBLEM_TASKS[ptype], fields=fields,
                   id_keys=("id", "problem_id"))


@FORMATS.register("r1_aqa")
def r1_aqa(record: Any, source: str, base_dir: Path) -> Sample:
    """Audio multiple choice. R1-AQA/AVQA: 'question_text', 'multi_choice', 'answer' = 0-based
    index, 'audio_path'; MMAU style: 'question', 'choices', 'answer' = option text or letter.
    AVQA questions say "video" while only the audio is given: like R1-AQA, the prompt says
    "audio" for dataset_name AVQA."""
    record = check_dict(record, source)
    question = text_of(record, ("question_text", "question"), source, "question")
    if record.get("dataset_name") == "AVQA":
        question = question.replace("video", "audio")
    choices = next((record[k] for k in ("multi_choice", "choices", "options") if record.get(k)), None)
    options = lettered_options(choices, source)
    if record.get("answer") is None:
        raise fail(source, "missing 'answer'")
    solution = answer_letter(record["answer"], options, source)
    audios = media_refs(record, ("audio_path", "audio_id", "audio", "audios"), base_dir, source)
    if not audios:
        raise fail(source, "missing 'audio_path' (or 'audio_id', 'audio')")
    text = f"{question.rstrip()}\n" + "\n".join(options)
    fields = passthrough(record, {"id", "task", "question_text", "question", "multi_choice",
                                   "choices", "options", "answer", "audio_path", "audio_id",
                                   "audio", "audios"})
    fields.update(options=options, problem_type="multiple choice")
    if record.get("task") is not None:  # MMAU's sound/music/speech: kept, but not the route
        fields["source_task"] = record["task"]
    return make_sample(record, source, text=with_hint(text, HINTS["multiple choice"]),
                   media={"audios": audios}, solution=solution, task="audio_qa", fields=fields,
                   record_task=False)


ASR_PROMPT = "Transcribe the audio. Answer with the transcript in <answer></answer>."
ASR_AUDIO = ("audio", "audios", "audio_path", "audio_filepath", "path")
ASR_TEXT = ("transcript", "text", "sentence")


@FORMATS.register("asr")
def asr(record: Any, source: str, base_dir: Path) -> Sample:
    """Speech recognition rows as LibriSpeech / Common Voice (HF Audio column + text or
    sentence) and NeMo manifests (audio_filepath + text) ship them: the transcript is the
    solution; the question is the record's prompt, else ASR_PROMPT."""
    record = check_dict(record, source)
    audios = media_refs(record, ASR_AUDIO, base_dir, source)
    if not audios:
        raise fail(source, f"missing the audio (one of {', '.join(map(repr, ASR_AUDIO))})")
    transcript = text_of(record, ASR_TEXT, source, "transcript")
    question = record.get("prompt") or record.get("question") or ASR_PROMPT
    fields = passthrough(record, {"id", "task", "prompt", "question", "file", *ASR_AUDIO,
                                   *ASR_TEXT})
    return make_sample(record, source, text=str(question), media={"audios": audios},
                       solution=unwrap(transcript).strip(), task="asr", fields=fields)


@FORMATS.register("time_r1")
def time_r1(record: Any, source: str, base_dir: Path) -> Sample:
    """Temporal grounding: solution [start, end] in seconds from 'timestamp' (or the single pair
    in 'timestamps'), query from 'sentence'/'query'/'sentences'. Charades-style files (Time-R1,
    VideoChat-R1: {video id: {"duration", "timestamps": [...], "sentences": [...]}}) arrive here
    one (timestamp, sentence) pair per record, with the video id as 'video_id' (file <id>.mp4).

    Time-R1's video_start/video_end cut a clip out of the source video: they stay as fields, so
    load_media decodes only that window, and the segment is shifted into clip time (the model
    sees the clip from 0 s); 'duration' becomes the clip's length (source_duration keeps the
    video's)."""
    record = check_dict(record, source)
    raw = record.get("timestamp", record.get("timestamps"))
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], list):
        raw = raw[0]
    seg = numbers(raw, 2, source, "timestamp") if raw is not None else None
    if seg is None:
        raise fail(source, f"'timestamp' must be [start, end] in seconds, got {raw!r:.80}")
    sentences = record.get("sentences")
    if isinstance(sentences, list) and len(sentences) == 1 and not record.get("sentence"):
        record = {**record, "sentence": sentences[0]}
    query = text_of(record, ("sentence", "query", "caption"), source, "event description")
    duration = _positive(record.get("duration"), "duration", source)
    if seg[0] < 0 or seg[1] < seg[0] or (duration is not None and seg[0] >= duration):
        raise fail(source, f"timestamp {seg} is not a segment inside the video "
                            f"(duration {duration})")
    fields = passthrough(record, {"id", "task", "video", "video_path", "path", "videos",
                                   "video_id", "timestamp", "timestamps", "sentence", "sentences",
                                   "query", "caption", "video_start", "video_end"})
    seg, clip = _clip(record, seg, duration, source)
    fields.update(clip)
    videos = media_refs(record, ("video", "video_path", "path", "videos"), base_dir, source)
    if not videos and isinstance(record.get("video_id"), str):
        vid = record["video_id"]
        videos = [media_ref(vid if Path(vid).suffix else f"{vid}.mp4", base_dir, source,
                             "video_id")]
    if not videos:
        raise fail(source, "missing 'video'")
    text = f'When does "{query.strip().rstrip(".")}" happen in the video? {TIME_HINT}'
    return make_sample(record, source, text=text, media={"videos": videos}, solution=seg,
                   task="temporal_grounding", fields=fields, id_keys=("id", "qid"))


def _positive(value: Any, key: str, source: str, zero: bool = False) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or value < 0 or (value == 0 and not zero)):
        raise fail(source, f"{key!r} must be a {'non-negative' if zero else 'positive'} number, "
                            f"got {value!r}")
    return value


def _clip(record: dict, seg: list[float], duration: float | None,
          source: str) -> tuple[list[float], dict]:
    """(segment in clip time, clip fields) for Time-R1's video_start/video_end.

    Time-R1 ships both kinds: files already cut to the clip ('duration' is the clip's length and
    the segment is in clip time: the window is only recorded, as source_video_start/end), and
    whole source videos (segment in source time): then the window is decoded and the segment
    shifted into clip time."""
    start, end = record.get("video_start"), record.get("video_end")
    if start is None and end is None:
        return seg, {}
    start = float(_positive(start, "video_start", source, zero=True) or 0.0)
    end = _positive(end, "video_end", source) or duration
    if end is None or end <= start:
        raise fail(source, f"video_end {end} must be a time after video_start {start}")
    length = end - start
    if duration is not None and abs(duration - length) <= 0.01 * length + 0.05:
        return seg, {"source_video_start": start, "source_video_end": float(end)}  # already cut
    if seg[0] < start or seg[1] > end + 1e-6:
        raise fail(source, f"timestamp {seg} is outside the clip [{start}, {end}] "
                            f"(video_start/video_end)")
    out = {"video_start": start, "video_end": float(end), "duration": round(length, 6)}
    if duration is not None:
        out["source_duration"] = duration
    return [round(seg[0] - start, 6), round(seg[1] - start, 6)], out


# ----------------------------------------------------------------------------------- convert ----

def sample_to_record(sample: Sample, out_dir: Path) -> dict:
    """A Sample as a native-schema record; media paths relative to `out_dir` where possible."""
    def rel(p: str) -> str:
        try:
            return os.path.relpath(p, out_dir)
        except ValueError:  # another drive (Windows)
            return os.path.abspath(p)

    record = {"id": sample.id, "task": sample.task, "messages": sample.messages}
    for kind in MEDIA_KINDS:
        paths = getattr(sample, kind)
        if paths:
            record[kind] = [rel(p) for p in paths]
    record["solution"] = sample.solution
    for key, value in sample.fields.items():
        record.setdefault(key, value)
    return record


def convert(fmt: str | None, in_path: str | Path, out_path: str | Path, *,
            media_root: str | Path | None = None, embedded_dir: str | Path | None = None) -> dict:
    """Read `in_path` in format `fmt` (None: detected, as `mmrl train` does: detect.py), write
    native JSONL to `out_path`.

    Relative media paths resolve against `media_root` (default: the input file's folder; Time-R1's
    "./dataset/..." paths are relative to its repository root instead). Embedded media go to
    `embedded_dir` (default: <out stem>_media next to the output). Stops at the first malformed
    record (RecordError names it) and then writes nothing. Returns {"records", "out", "by_task",
    "format"}."""
    if fmt is not None:
        FORMATS.get(fmt)  # an unknown name fails before the input is read
    out_path = Path(out_path)
    samples = load_samples(in_path, fmt)
    if media_root:
        samples.base = Path(media_root)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    embedded = Path(embedded_dir) if embedded_dir else out_path.parent / f"{out_path.stem}_media"
    by_task: dict[str, int] = {}
    tmp = out_path.with_name(f"{out_path.name}.tmp")
    try:
        with embedding_into(embedded), tmp.open("w") as f:
            for i in range(len(samples)):
                sample = samples[i]
                by_task[sample.task] = by_task.get(sample.task, 0) + 1
                f.write(json.dumps(sample_to_record(sample, out_path.parent)) + "\n")
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"records": sum(by_task.values()), "out": str(out_path), "by_task": by_task,
            "format": samples.format}
