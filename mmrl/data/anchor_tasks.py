"""Learning-table tasks written in the anchor projects' own record formats.

`anchor_<recipe>` draws the bundled synthetic task (media whose content alone decides the answer:
counts, boxes, which colour comes first, when a square is visible, tone digits, beep counts) and writes
its records as the recipe's anchor writes them, to `anchor_train.jsonl` / `anchor_eval.jsonl`;
the learning table then runs `mmrl data convert --from FORMAT` on them, so the adapters are part
of what is measured. Returns {"train", "eval", "format"}.

    counting            r1v        {"problem", "solution": "<answer> 3 </answer>", "image"}
    vqa, classification easyr1     {"problem", "answer", "images"}
    detection           vlm_r1     {"image", "conversations": [human "<image>Q", gpt "[x1,..]"]}
    video_qa            video_r1   {"problem_type": "multiple choice", "options", "path", ...}
    temporal_grounding  time_r1    {"video", "duration", "timestamp", "sentence"}
    audio_qa            r1_aqa     {"audio_path", "question_text", "multi_choice", "answer": index}
    asr, captioning     easyr1     {"problem", "answer", "audios" | "images"}
    audio_visual        easyr1     {"problem", "answer", "videos", "audios"}
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from mmrl.data.schema import write_jsonl as _write_jsonl
from mmrl.data.synthetic import GENERATORS

_ANSWER_HINT = re.compile(r"\s*Answer with .*$", re.S)


def _question(record: dict) -> str:
    """The native prompt without its trailing answer-format sentence (the adapters add theirs)."""
    return _ANSWER_HINT.sub("", record["prompt"]).strip()


def _counting(r: dict) -> dict:
    return {"id": r["id"], "image": r["images"][0],
            "problem": r["prompt"], "solution": f"<answer> {r['solution']} </answer>"}


def _easyr1(r: dict) -> dict:
    media = {k: r[k] for k in ("images", "videos", "audios") if r.get(k)}
    return {"id": r["id"], "problem": r["prompt"], "answer": r["solution"], **media}


def _detection(r: dict) -> dict:
    # VLM-R1's REC files carry no image size: the adapter must find it (issue #11).
    return {"id": r["id"], "image": r["images"][0],
            "conversations": [{"from": "human", "value": "<image>" + r["prompt"]},
                              {"from": "gpt", "value": json.dumps(r["solution"])}]}


def _video_r1(r: dict) -> dict:
    # Video-R1 keeps the question and its options apart; its template lists the options.
    return {"problem_id": r["id"], "problem": _question(r).split("\n")[0], "data_type": "video",
            "problem_type": "multiple choice", "options": r["options"], "path": r["videos"][0],
            "solution": f"<answer>{r['solution']}</answer>"}


def _time_r1(r: dict) -> dict:
    return {"qid": r["id"], "video": r["videos"][0], "duration": r["duration"],
            "timestamp": r["solution"], "sentence": "the red square is visible"}


def _r1_aqa(r: dict) -> dict:
    choices = [o.split(". ", 1)[1] for o in r["options"]]
    return {"id": r["id"], "audio_path": r["audios"][0], "question_text": _question(r).split("\n")[0],
            "multi_choice": choices, "answer": "ABCD".index(r["solution"]),
            "dataset_name": "synthetic"}


# 1000 training records (a tiny model overfits 200 in the SFT warm-up) and 100 held out (the
# eval's max_samples), as counting's own 2000/200 default.
_SPLIT = {"n_train": 1000, "n_eval": 100}

# recipe -> (bundled generator, generator kwargs, anchor format, record writer)
ANCHORS: dict[str, tuple[str, dict, str, Callable[[dict], dict]]] = {
    "counting": ("counting", {}, "r1v", _counting),
    "vqa": ("counting", {"choices": True}, "easyr1", _easyr1),
    # 1-2 shapes: listing all three without looking scores Jaccard 1/2, not 2/3. 10000 records:
    # its warm-up takes 400+ steps x 32, and on 1000 it memorised them (sampled training reward
    # 0.9, held-out 0.7), so RL on the training prompts had nothing left to teach.
    "classification": ("classification", {**_SPLIT, "n_train": 10000, "max_shapes": 2},
                       "easyr1", _easyr1),
    # 84 px on a 3x3 grid of 28-px cells: one visual token per cell (Qwen merges 28-px squares).
    "detection": ("detection", {**_SPLIT, "size": 84, "cells": 3, "min_side": 16, "max_side": 24},
                  "vlm_r1", _detection),
    # Which colour comes first: order decides it (both colours are in every clip). Motion
    # direction stayed at chance through the warm-up (docs/learning.md).
    "video_qa": ("video_qa", {**_SPLIT, "question": "first_colour", "square": 24},
                 "video_r1", _video_r1),
    "temporal_grounding": ("temporal_grounding", {**_SPLIT, "fps": 2, "size": 56, "square": 20,
                                                  "min_seconds": 4, "max_seconds": 6,
                                                  "whole_seconds": True},
                           "time_r1", _time_r1),
    "audio_qa": ("audio_qa", _SPLIT, "r1_aqa", _r1_aqa),
    "asr": ("asr", {**_SPLIT, "min_digits": 2, "max_digits": 3}, "easyr1", _easyr1),
    "captioning": ("captioning", _SPLIT, "easyr1", _easyr1),
    "audio_visual": ("audio_visual", _SPLIT, "easyr1", _easyr1),
}


def _make(recipe: str) -> Callable[..., dict]:
    base, fixed, fmt, write = ANCHORS[recipe]

    def generate(out_dir: str | Path, **kwargs) -> dict[str, str]:
        out = Path(out_dir)
        paths = GENERATORS.get(base)(out, **{**fixed, **kwargs})
        result = {"format": fmt}
        for split in ("train", "eval"):
            native = Path(paths[split])
            records = [json.loads(line) for line in native.read_text().splitlines()]
            native.unlink()  # only the anchor's file remains: the run must convert it
            target = out / f"anchor_{split}.jsonl"
            _write_jsonl(target, [write(r) for r in records])
            result[split] = str(target)
        return result

    generate.__doc__ = f"`{base}` task written as {fmt} records (anchor of recipe {recipe})."
    return generate


for _recipe in ANCHORS:
    GENERATORS.add(f"anchor_{_recipe}", _make(_recipe))
