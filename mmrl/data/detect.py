"""Which record adapter reads a file: one rule for `mmrl train`, `mmrl eval`, `mmrl data inspect`
and `mmrl data convert`. Precedence: a `--format` flag; then a config's `data.format`, where it
reads the file's first record; then detection from the column names (Parquet, Arrow) or the
first record's keys (JSON, JSONL). Kept apart from the adapters themselves (formats.py)."""
from __future__ import annotations

from pathlib import Path

from mmrl.data.media_errors import RecordError

# First match wins: every key set must be present. Order: the most specific layouts first.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("vlm_r1", ("conversations",)),
    ("video_r1", ("problem_type", "problem")),
    ("r1_aqa", ("audio_path", "question_text")),
    ("r1_aqa", ("audio", "question", "choices")),
    ("r1_aqa", ("audio_id", "question", "choices")),  # MMAU
    ("time_r1", ("video", "timestamp")),
    ("time_r1", ("video", "timestamps")),
    ("asr", ("audio", "transcript")),  # LibriSpeech / Common Voice / NeMo manifests
    ("asr", ("audio", "text")),
    ("asr", ("audio", "sentence")),
    ("asr", ("audio_filepath", "text")),
    ("asr", ("audio_path", "text")),
    ("easyr1", ("problem", "answer")),
    ("r1v", ("problem", "solution")),
    ("mmrl", ("prompt", "solution")),
    ("mmrl", ("messages",)),  # native, LLaMA-Factory and OpenAI-style chats alike
]
NAMES = "mmrl, sharegpt, vlm_r1, r1v, easyr1, video_r1, r1_aqa, time_r1, asr"

# The rule "no silent media drop": a record key that names media, and the keys each format reads.
# A record holding one that its format does not read is an error (check_media_keys), never a
# sample trained without that media.
MEDIA_KEYS = ("image", "images", "video", "videos", "audio", "audios", "image_path",
              "video_path", "audio_path")
NATIVE_MEDIA = frozenset({"image", "images", "video", "videos", "audio", "audios"})
READS: dict[str, frozenset[str]] = {
    "mmrl": NATIVE_MEDIA, "sharegpt": NATIVE_MEDIA,
    "vlm_r1": frozenset({"image", "images", "video", "videos"}),
    "r1v": NATIVE_MEDIA, "easyr1": NATIVE_MEDIA,
    "video_r1": frozenset({"path", "image", "video"}),
    "r1_aqa": frozenset({"audio_path", "audio_id", "audio", "audios"}),
    "time_r1": frozenset({"video", "video_path", "path", "videos"}),
    "asr": frozenset({"audio", "audios", "audio_path", "audio_filepath", "path"}),
}
DETECT = frozenset({"null", "none", "auto"})  # --format words that ask for detection


def detect_format(columns: list[str], source: str) -> str:
    """The adapter name for a table with these columns; a ValueError naming them otherwise."""
    have = set(columns)
    for name, keys in RULES:
        if have.issuperset(keys):
            return name
    raise ValueError(f"{source}: cannot tell the record format from the columns {sorted(have)}; "
                     f"set data.format ({NAMES})")


def resolve_format(table, where: str, base: Path, adapters, *, flag: str | None = None,
                   configured: str | None = None) -> tuple[str, str | None]:
    """(format, a note for the user or None) for a table (module docstring). A configured format
    that cannot read the first record gives way to the detected one, with a note saying so;
    when neither reads it, the configured one stays (its error names the record).
    `adapters`: the FORMATS registry (schema.py, which imports this module)."""
    if flag:
        return flag, None
    record, source = table[0]
    keys = table.columns if table.columns is not None else (
        list(record) if isinstance(record, dict) else [])
    try:
        detected = detect_format(keys, where)
    except ValueError:
        if table.columns is not None and not configured:
            raise
        detected = None if table.columns is not None else "mmrl"  # the native schema's errors
    if not configured or configured == detected:
        return detected or configured, None
    problem = _reads(adapters.get(configured), configured, record, source, base)
    if problem is None or detected is None or _reads(adapters.get(detected), detected, record,
                                                     source, base) is not None:
        return configured, None
    what = "columns" if table.columns is not None else "first record's keys"
    return detected, (f"{where}: data.format={configured} does not read this file ({problem}); "
                      f"its {what} say {detected}, so it is read as {detected} (set data.format="
                      f"{detected} to silence this)")


def _reads(adapt, fmt: str, record, source: str, base: Path) -> str | None:
    try:
        check_media_keys(record, fmt, source)
        adapt(record, source, base)
    except RecordError as e:
        return str(e)
    return None


def check_media_keys(record, fmt: str, source: str) -> None:
    """RecordError when the record holds media under a key that `fmt` does not read: trained,
    the sample would silently lack that media. Formats outside READS (a user's) are trusted."""
    reads = READS.get(fmt)
    if reads is None or not isinstance(record, dict):
        return
    for key in MEDIA_KEYS:
        if key not in reads and record.get(key) not in (None, "", [], {}):
            plural = key.split("_")[0].rstrip("s") + "s"
            fix = (f"rename {key!r} to {plural!r}" if reads is NATIVE_MEDIA else
                   f"write the records in the native schema (prompt, solution, 'images' / "
                   f"'videos' / 'audios') and set data.format=mmrl, or drop {key!r}")
            raise RecordError(f"{source}: {key!r} holds media that format {fmt} does not read "
                              f"(it reads {', '.join(sorted(reads))}), so it would train without "
                              f"it. Fix: {fix}")
