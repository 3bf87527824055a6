"""Which record adapter reads a table, from its column names (Parquet / Arrow input with
`data.format` unset). Kept apart from the adapters themselves (formats.py)."""
from __future__ import annotations

# First match wins: every key set must be present. Order: the most specific layouts first.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("vlm_r1", ("conversations",)),
    ("video_r1", ("problem_type", "problem")),
    ("r1_aqa", ("audio_path", "question_text")),
    ("r1_aqa", ("audio", "question", "choices")),
    ("time_r1", ("video", "timestamp")),
    ("time_r1", ("video", "timestamps")),
    ("easyr1", ("problem", "answer")),
    ("r1v", ("problem", "solution")),
    ("mmrl", ("prompt", "solution")),
    ("mmrl", ("messages", "solution")),
]


def detect_format(columns: list[str], source: str) -> str:
    """The adapter name for a table with these columns; a ValueError naming them otherwise."""
    have = set(columns)
    for name, keys in RULES:
        if have.issuperset(keys):
            return name
    raise ValueError(f"{source}: cannot tell the record format from the columns {sorted(have)}; "
                     f"set data.format (mmrl, vlm_r1, r1v, easyr1, video_r1, r1_aqa, time_r1)")
