"""The multiple-choice answer parsers lmms-eval's tasks use, shared by the benchmarks that use
them: MMAU's (and MMMU's) `parse_multi_choice_response`, V*'s `extract_answer_letter`."""
from __future__ import annotations

import random
import re


def parse_multi_choice(response: str, letters: list[str], rng: random.Random) -> str:
    """The letter a response names: "(A)" first, then " A ", then "A."; the last one mentioned
    wins when several are; none: a random letter (lmms-eval's rule, with a seeded `rng`)."""
    for char in [",", ".", "!", "?", ";", ":", "'"]:
        response = response.strip(char)
    response = " " + response + " "
    candidates = [c for c in letters if f"({c})" in response]
    if not candidates:
        candidates = [c for c in letters if f" {c} " in response]
    if not candidates:
        candidates = [c for c in letters if f"{c}." in response]
    if not candidates:
        return rng.choice(letters)
    if len(candidates) > 1:
        starts = [response.rfind(f" {c} ") for c in candidates]
        return candidates[starts.index(max(starts))]  # argmax: the first of equal maxima
    return candidates[0]


_LETTER_PATTERNS = [
    r"^([A-D])\s*[\.)\]]*",
    r"(?:THE\s+)?(?:ANSWER|CHOICE|OPTION)(?:\s+IS)?[\s:]+([A-D])",
    r"\(([A-D])\)",
    r"([A-D])\s*(?:\.|\)|])",
    r"(?:^|\s)([A-D])(?:\s|$)",
]


def extract_letter(response: str) -> str | None:
    """V*'s letter: the first pattern that matches (a leading letter, "Answer: A", "(A)", "A.",
    a standalone letter), else the only A-D in the text, else none."""
    response = response.strip().upper()
    for pattern in _LETTER_PATTERNS:
        m = re.search(pattern, response, re.IGNORECASE)
        if m:
            return m.group(1).upper()
    letters = re.findall(r"[A-D]", response)
    if len(letters) == 1:
        return letters[0]
    return response[0] if response and response[0] in "ABCD" else None
