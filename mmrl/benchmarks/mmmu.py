"""MMMU val, as lmms-eval's `mmmu_val` (its chat-model messages: the question's "<image k>"
marks split the text around the images, interleaved; "A. ..." options; "Answer with the option's
letter from the given choices directly." or "Answer the question using a single word or
phrase."), scored with the MMMU repo's rules lmms-eval keeps: the option parser (with a seeded
random letter where it finds none) and the open-answer parser (numbers and key phrases)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from mmrl.benchmarks.base import Benchmark, Context, medium, png_cell, write_parquet
from mmrl.types import Sample

MC_PROMPT = "Answer with the option's letter from the given choices directly."
OPEN_PROMPT = "Answer the question using a single word or phrase."


def prompt_raw(row: dict) -> str:
    """The question and its "A. option" lines, "<image k>" marks as the dataset writes them."""
    if row["question_type"] != "multiple-choice":
        return row["question"]
    options = ast.literal_eval(row["options"])
    return row["question"] + "\n" + "\n".join(
        f"{chr(ord('A') + i)}. {o}" for i, o in enumerate(options))


def prompt(row: dict) -> str:
    """The prompt text, "<image k>" marks as lmms-eval's interleaved format writes them."""
    mc = row["question_type"] == "multiple-choice"
    text = f"{prompt_raw(row)}\n\n{MC_PROMPT if mc else OPEN_PROMPT}"
    for i in range(1, 8):
        text = text.replace(f"<image {i}>", "<image>")
    return text


def image_keys(row: dict) -> list[str]:
    """The image columns the question names, sorted (lmms-eval's doc_to_visual)."""
    found = re.findall(r"<image \d+>", prompt_raw(row))
    return sorted({t.strip("<>").replace(" ", "_") for t in found})


def content(row: dict) -> list[dict]:
    """lmms-eval's mmmu_doc_to_messages: text before image i (stripped, when not empty), image
    i, ..., then the text after the last "<image>" (always)."""
    parts, out = prompt(row).split("<image>"), []
    for i in range(len(image_keys(row))):
        if i < len(parts) - 1 and parts[i].strip():
            out.append({"type": "text", "text": parts[i].strip()})
        out.append({"type": "image"})
    return out + [{"type": "text", "text": parts[-1].strip()}]


def to_sample(row: dict, root: Path, source: str, ctx: Context) -> Sample:
    return Sample(id=row["id"], messages=[{"role": "user", "content": content(row)}],
                  solution=row["answer"], task=row["question_type"], source=source,
                  images=[medium(row[k], root, source, k) for k in image_keys(row)])


def parse_choice(response: str, options: list[str], ctx: Context) -> str:
    """The MMMU repo's option parser: "(A)", then "A ", then "A.", then (in a reply of more
    than five words) an option's text; the last mention wins; none: a seeded random letter."""
    letters = [chr(ord("A") + i) for i in range(len(options))]
    index2ans = dict(zip(letters, options))
    for char in [",", ".", "!", "?", ";", ":", "'"]:
        response = response.strip(char)
    response = " " + response + " "
    by_letter, bracket = True, False
    found = [c for c in letters if f"({c})" in response]
    bracket = bool(found)
    if not found:
        found = [c for c in letters if f"{c} " in response]
    if not found:
        found = [c for c in letters if f"{c}." in response]
    if not found and len(response.split()) > 5:
        found = [c for c, a in index2ans.items() if a.lower() in response.lower()]
        by_letter = not found
    if not found:
        return ctx.rng.choice(letters)
    if len(found) == 1:
        return found[0]
    if not by_letter:
        starts = [response.lower().rfind(index2ans[c].lower()) for c in found]
    elif bracket:
        starts = [response.rfind(f"({c})") for c in found]
    else:
        starts = [response.rfind(f" {c} ") for c in found]
    return found[starts.index(max(starts))]


def numbers(text: str) -> list[str]:
    """Numbers with thousands commas, in scientific notation, and plain ones (in that order)."""
    return (re.findall(r"-?\b\d{1,3}(?:,\d{3})+\b", text)
            + re.findall(r"-?\d+(?:\.\d+)?[eE][+-]?\d+", text)
            + re.findall(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])", text))


def normalize(text: str) -> list:
    """A number (commas dropped, rounded to 2 places) or the lower-cased text; one character
    is padded with a space on either side (no trivial substring matches)."""
    text = text.strip()
    try:
        return [round(float(text.replace(",", "")), 2)]
    except ValueError:
        text = text.lower()
        return [" " + text, text + " "] if len(text) == 1 else [text]


KEYS = ["could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result "]


def key_phrases(response: str) -> list[str]:
    """Per sentence, the shortest tail after a key word ("is ", "so ", ...; "=" in the last)."""
    response = response.strip().strip(".").lower()
    sentences, out = re.split(r"\.\s(?=[A-Z])|\n", response), []
    for i, sentence in enumerate(sentences):
        keys = KEYS + (["="] if i == len(sentences) - 1 else [])
        tails = [sentence.split(k)[-1].strip() for k in keys if k in sentence]
        shortest = None
        for tail in tails:  # the first of the shortest, as the repo's loop keeps it
            if not shortest or len(tail) < len(shortest):
                shortest = tail
        if shortest and shortest.strip() not in [":", ",", ".", "!", "?", ";", "'"]:
            out.append(shortest)
    return out or [response]


def parse_open(response: str) -> list:
    phrases = key_phrases(response)
    found = phrases + [n for p in phrases for n in numbers(p)]
    return list({v for p in found for v in normalize(p)})


def open_correct(answer, preds: list) -> bool:
    golds = [v for a in (answer if isinstance(answer, list) else [answer]) for v in normalize(a)]
    for pred in preds:
        if isinstance(pred, str):
            if any(isinstance(g, str) and g in pred for g in golds):
                return True
        elif pred in golds:
            return True
    return False


def score(row: dict, text: str, ctx: Context) -> dict:
    if row["question_type"] == "multiple-choice":
        pred = parse_choice(text, ast.literal_eval(row["options"]), ctx)
        correct = pred == row["answer"]
    else:
        pred = parse_open(text)
        correct = open_correct(row["answer"], pred)
    return {"parsed_pred": pred, "subject": row["id"].split("_", 1)[1].rsplit("_", 1)[0],
            "correct": float(correct)}


def aggregate(rows: list[dict]) -> dict:
    """Accuracy over all questions as a fraction rounded to 5 places (lmms-eval's "Overall"),
    and per subject."""
    out = {"accuracy": round(sum(r["correct"] for r in rows) / len(rows), 5) if rows else 0}
    for subject in sorted({r["subject"] for r in rows}):
        sub = [r["correct"] for r in rows if r["subject"] == subject]
        out[f"accuracy/{subject}"] = round(sum(sub) / len(sub), 5)
    return out


def write_fixture(root: Path, n: int, seed: int) -> None:
    """`data/validation-00000-of-00001.parquet`: id (validation_SUBJECT_N), question (with
    "<image k>" marks), options (a Python list's text), explanation, image_1..image_7
    ({bytes, path} or null), img_type, answer, topic_difficulty, question_type, subfield."""
    subjects = ["Art", "Math", "Physics", "Computer_Science"]
    rows = []
    for i in range(n):
        mc = i % 3 != 2
        two = i % 4 == 1
        question = (f"<image 1> What does the figure show in case {i}?" if not two else
                    f"Compare <image 1> with <image 2>: which is larger for item {i}?")
        row = {"id": f"validation_{subjects[i % 4]}_{i + 1}", "question": question,
               "options": str([f"{i} apples", f"{i + 1} pears", "none"]) if mc else "[]",
               "explanation": "", "img_type": "['Diagrams']",
               "answer": "ABC"[i % 3] if mc else str(i * 1000 + 0.5),
               "topic_difficulty": "Easy", "question_type": "multiple-choice" if mc else "open",
               "subfield": "fixture"}
        for k in range(1, 8):
            row[f"image_{k}"] = png_cell(32, 32, seed + i * 8 + k) if k <= 1 + two else None
        rows.append(row)
    write_parquet(root / "data" / "validation-00000-of-00001.parquet", rows)


BENCHMARK = Benchmark(
    name="mmmu", title="MMMU val, college-level multimodal questions", hub="lmms-lab/MMMU",
    lmms_task="mmmu_val", files="data/validation-*.parquet", metric="accuracy",
    to_sample=to_sample, score=score, aggregate=aggregate, write_fixture=write_fixture,
    max_new_tokens=128)
