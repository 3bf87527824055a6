"""`mmrl data inspect FILE`: what a data file holds and what in it will not load.

Counts records by task and modality, lists malformed records (RecordError, each with file:line)
and media that fail to open (record source + path), and renders a few prompts as the model will
see them (media as <image>/<video>/<audio> markers). Checking media opens each file and reads its
header (image header, first video stream, audio info), not a full decode: `deep=True` decodes
everything with the training loaders instead.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from mmrl.data.audio import MIN_SECONDS, too_short
from mmrl.data.media import MediaError, frame_folder, image_too_big, load_audio, load_image, \
    load_media, load_video, processor_errors
from mmrl.data.schema import RecordError, load_samples
from mmrl.types import Sample
from rewards.calls import call_reward


def render_prompt(sample: Sample) -> str:
    """The chat as plain text: one "role: ..." line per message, media as markers."""
    lines = []
    for msg in sample.messages:
        content = msg.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = " ".join(c.get("text", "") if c.get("type") == "text" else f"<{c.get('type')}>"
                            for c in content or [] if isinstance(c, dict))
        lines.append(f"{msg.get('role')}: {text}")
    return "\n".join(lines)


def check_media(kind: str, path: str, source: str, deep: bool = False,
                frame_fps: float | None = None) -> str | None:
    """None if the file opens, else the error message (which names source and path).
    `frame_fps`: the record's rate for a video that is a folder of frames."""
    try:
        if deep:
            {"images": lambda: load_image(path, source),
             "videos": lambda: load_video(path, source=source, nframes=2, frame_fps=frame_fps),
             "audios": lambda: load_audio(path, source=source)}[kind]()
        else:
            _open_header(kind, path, source, frame_fps)
    except MediaError as e:
        return str(e)
    return None


def _open_header(kind: str, path: str, source: str, frame_fps: float | None = None) -> None:
    where = f"{source}: " if source else ""
    p = Path(path)
    if kind == "videos" and p.is_dir():
        frame_folder(path, frame_fps, source)  # frames there, and their rate known
        return
    if p.is_dir():
        raise MediaError(f"{where}{kind[:-1]} {path}: is a folder, not a file")
    if not p.is_file():
        raise MediaError(f"{where}{kind[:-1]} {path}: file not found")
    if p.stat().st_size == 0:
        raise MediaError(f"{where}{kind[:-1]} {path}: file is empty (0 bytes)")
    try:
        if kind == "images":
            from PIL import Image

            with Image.open(path) as im:
                too_big = image_too_big(im, None)  # from the header: a bomb is found here
                if too_big:
                    raise MediaError(too_big)
                im.verify()
            return
        if kind == "audios" and p.suffix.lower() in (".wav", ".flac", ".ogg"):
            import soundfile as sf

            info = sf.info(path)
            if info.frames == 0:
                raise MediaError("no audio samples")
            if info.frames < MIN_SECONDS * info.samplerate:
                raise MediaError(too_short(info.frames / info.samplerate))
            return
        import av

        with av.open(path) as container:
            streams = container.streams.video if kind == "videos" else container.streams.audio
            if not streams:
                raise MediaError(f"no {kind[:-1]} stream")
            if streams[0].codec_context is None:
                raise MediaError("no decoder for its codec")
    except Exception as e:  # PIL, soundfile and FFmpeg errors alike
        raise MediaError(f"{where}cannot open {kind[:-1]} {path}: {e}") from None


def processor_check(adapter):
    """`sample -> error message or None`: the training path's decode plus the model family's
    processor call (`adapter`, mmrl/models: a tiny offline processor with the same checks:
    aspect ratio, minimum size, frame and token limits), so `--deep` finds what would stop
    training. Samples with media the family cannot take are not checked (None)."""
    _, processor = adapter.tiny()

    def check(sample: Sample) -> str | None:
        kinds = [k for k in ("images", "videos", "audios") if getattr(sample, k)]
        if not kinds or any(k not in adapter.media_kinds for k in kinds):
            return None
        try:
            media = load_media(sample)
            with processor_errors(sample):
                adapter.prompt_features(processor, sample, **media)
        except MediaError as e:
            return str(e)
        return None

    return check


def inspect_file(path: str | Path, fmt: str | None = None, n_show: int = 3, *, check: bool = True,
                 deep_check=None, max_records: int | None = None,
                 media_root: str | Path | None = None, configured: str | None = None,
                 deep: bool = False) -> dict:
    """Report on a data file: {"path", "format", "records", "by_task", "by_modality",
    "bad_records": [msg], "bad_media": [{"source", "kind", "path", "error"}], "examples":
    [{"id", "task", "prompt", "solution", "media"}], "notes"}. Never raises for bad records or
    media. The format follows train's rule (detect.py): `fmt` (a --format flag), else
    `configured` (a config's data.format) where it reads the file, else detected. Relative
    media paths resolve against `media_root` (default: the file's folder). `deep` decodes every
    media file; `deep_check` (`processor_check`) also runs the model family's processor."""
    by_task: Counter = Counter()
    by_modality: Counter = Counter()
    bad_records, bad_media, examples = [], [], []
    try:  # every JSONL line that is not JSON is listed, and the other lines inspected
        samples = load_samples(path, fmt, max_records, configured=configured,
                               bad_lines=bad_records)
    except (RecordError, FileNotFoundError) as e:  # e.g. a JSON list cut short: nothing loads
        return {"path": str(path), "format": fmt or configured, "records": 0, "by_task": {},
                "by_modality": {}, "bad_records": [*bad_records, str(e)], "bad_media": [],
                "examples": [], "notes": [], "unreadable": True}
    if media_root:
        samples.base = Path(media_root)
    n = len(samples)
    opened: dict[tuple[str, str, float | None], str | None] = {}  # each file is opened once
    for i in _progress(n):
        try:
            sample = samples[i]
        except RecordError as e:
            bad_records.append(str(e))
            continue
        except MediaError as e:  # an embedded item that does not decode, a URL not fetched
            bad_media.append({"source": str(e).split(": ", 1)[0], "kind": "media", "path": "",
                              "error": str(e)})
            continue
        source = sample.source
        by_task[sample.task] += 1
        kinds = [k for k in ("images", "videos", "audios") if getattr(sample, k)]
        by_modality["+".join(k[:-1] for k in kinds) or "text"] += 1
        if check:
            before = len(bad_media)
            for kind in kinds:
                for media_path in getattr(sample, kind):
                    key = (kind, media_path, sample.fields.get("frame_fps"))
                    if key not in opened:
                        opened[key] = check_media(kind, media_path, "", deep, key[2])
                    error = opened[key] and f"{source}: {opened[key]}"
                    if error:
                        bad_media.append({"source": source, "kind": kind[:-1], "path": media_path,
                                          "error": error})
            # Files that open can still be refused by the processor (e.g. a 600x2 image).
            error = deep_check(sample) if deep_check and len(bad_media) == before else None
            if error:
                bad_media.append({"source": source, "kind": "processor", "path": "",
                                  "error": error})
        if len(examples) < n_show:
            examples.append({"id": sample.id, "task": sample.task, "prompt": render_prompt(sample),
                             "solution": sample.solution,
                             "media": {k: getattr(sample, k) for k in kinds}})
    return {"path": str(path), "format": samples.format, "records": n, "by_task": dict(by_task),
            "by_modality": dict(by_modality), "bad_records": bad_records, "bad_media": bad_media,
            "examples": examples, "notes": samples.notes}


def _progress(n: int):
    """range(n), with a bar on a terminal for files that take a while."""
    import sys

    from rich.console import Console
    from rich.progress import track

    return track(range(n), description="inspect", transient=True, console=Console(stderr=True),
                 disable=n < 5000 or not sys.stderr.isatty())


def format_report(report: dict, max_listed: int = 20) -> str:
    """Human-readable text for `mmrl data inspect`."""
    if report.get("unreadable"):  # nothing loads: the one reason is the report
        return f"{report['path']}: cannot be read: {report['bad_records'][0]}"
    out = [f"{report['path']} (format {report['format']}): {report['records']} records",
           *[f"note: {note}" for note in report.get("notes", [])],
           "by task:     " + ", ".join(f"{k}={v}" for k, v in sorted(report["by_task"].items())),
           "by modality: " + ", ".join(f"{k}={v}" for k, v in sorted(report["by_modality"].items()))]
    for title, items in (("malformed records", report["bad_records"]),
                         ("media that fail to open", [m["error"] for m in report["bad_media"]])):
        out.append(f"{title}: {len(items)}")
        out += [f"  {item}" for item in items[:max_listed]]
        if len(items) > max_listed:
            out.append(f"  ... and {len(items) - max_listed} more")
    for ex in report["examples"]:
        out += [f"--- {ex['id']} ({ex['task']})", ex["prompt"],
                f"solution: {json.dumps(ex['solution'])}"]
    return "\n".join(out)


# ------------------------------------------------------------------------------ scorability ----
# A reward can score a record if, given the record's own gold answer as the completion (wrapped
# as "<think>probe</think><answer>GOLD</answer>", lists as JSON), it returns a number rather than
# None. None there means the reward lacks something it needs (an image size, a duration, options)
# and would score None for every completion: the run would train on the other rewards alone.
# Only records of the reward's `tasks` count. Pure, cheap: one reward call per reward.
# The field whose absence is the usual reason a reward returns None (named in the report).
NEEDED_FIELD = {"iou": "image_size", "giou": "image_size", "detection": "image_size",
                "tiou_v2": "duration"}


def probe_completion(solution) -> str:
    gold = solution if isinstance(solution, str) else json.dumps(solution)
    return f"<think>probe</think><answer>{gold}</answer>"


def reward_scorability(specs, samples: list[Sample], max_new_tokens: int = 1024) -> list[dict]:
    """Per reward spec (name, params, tasks): {"reward", "scorable", "of", "reason"}."""
    import functools

    from rewards import get_reward

    out = []
    for spec in specs:
        fn = get_reward(spec.name)
        if spec.params:
            fn = functools.partial(fn, **dict(spec.params))
        rows = [s for s in samples if spec.tasks is None or s.task in spec.tasks]
        scores = []
        if rows:
            keys = {k for s in rows for k in s.fields}
            fields = {k: [s.fields.get(k) for s in rows] for k in keys}
            # calls: a trajectory without tool calls (the tool_use reward reads them); info:
            # one whose environment said nothing (mmrl/envs)
            fields.update(task=[s.task for s in rows], completion_length=[1] * len(rows),
                          max_completion_length=[max_new_tokens] * len(rows),
                          calls=[[] for _ in rows], info=[{} for _ in rows])
            scores = call_reward(fn, spec.name, [probe_completion(s.solution) for s in rows],
                                 [s.solution for s in rows], fields,
                                 [f"{s.id} ({s.source})" for s in rows])
        unscored = [s for s, v in zip(rows, scores) if v is None]
        name = spec.name.rsplit(":", 1)[-1]
        need = NEEDED_FIELD.get(name)
        missing = need is not None and any(need not in s.fields for s in unscored)
        reason = (f"no {need}" if missing else
                  "it returns None for the gold answer") if unscored else ""
        out.append({"reward": name, "scorable": len(rows) - len(unscored),
                    "of": len(rows), "reason": reason})
    return out


def format_scorability(rows: list[dict]) -> list[str]:
    """`iou: 0 of 1200 records scorable (no image_size)`."""
    return [f"{r['reward']}: {r['scorable']} of {r['of']} records scorable"
            + (f" ({r['reason']})" if r["reason"] else "") for r in rows]


LAZY_CHECK_ROWS = 8


def spread(samples, sample_size: int = 256) -> list[Sample]:
    """Up to `sample_size` samples spread over the data set; of a table read by row group
    (Parquet, Arrow), its first LAZY_CHECK_ROWS rows: one row group read and a few embedded
    images written, not every one."""
    if isinstance(samples, list) or getattr(samples, "cheap_rows", False):
        picks = range(0, len(samples), max(1, len(samples) // sample_size))[:sample_size]
    else:
        picks = range(min(len(samples), LAZY_CHECK_ROWS))
    out, bad = [], None
    for i in picks:
        try:
            out.append(samples[i])
        except MediaError as e:  # a bad embedded item: the skip policy's, when it is drawn
            bad = bad or e
    if bad is not None and not out:
        raise bad
    return out


def check_scorable(specs, samples, max_new_tokens: int = 1024, sample_size: int = 256) -> None:
    """Stop before training when a reward can score none of its task's records (checked on the
    `spread` of the data set)."""
    picked = spread(samples, sample_size)
    rows = reward_scorability(specs, picked, max_new_tokens)
    dead = [r for r in rows if r["of"] and not r["scorable"]]
    if dead:
        raise ValueError("a configured reward can score none of its records, so it would train "
                         "on nothing: " + "; ".join(format_scorability(dead))
                         + f" (checked {len(picked)} records; see `mmrl data "
                           f"inspect FILE --config CONFIG`)")


# ----------------------------------------------------------------------------- answer budget ----
def answer_budget(samples, tokenizer, target: str, max_new_tokens: int,
                  sample_size: int = 256) -> dict | None:
    """Whether the gold answers, written as `target` (sft.target, e.g. "<answer>{solution}</answer>")
    plus end-of-sequence, fit in `max_new_tokens`. A completion cut at the budget has no closing
    tag, so a record whose gold answer does not fit can never score: the run silently loses it
    (a 3-label answer of 21 tokens under a budget of 16 did exactly that). None when all fit, else
    {"over", "of", "longest"} over up to `sample_size` records spread over the data set."""
    picked = spread(samples, sample_size)
    lengths = [len(tokenizer(target.format(**{**s.fields, "solution": s.solution}), add_special_tokens=False)
                   ["input_ids"]) + 1 for s in picked if s.solution is not None]
    over = sum(n > max_new_tokens for n in lengths)
    return {"over": over, "of": len(lengths), "longest": max(lengths)} if over else None


def answer_budget_warning(cfg, samples, tokenizer) -> str | None:
    """The run's start warning when rollout.max_new_tokens cuts gold answers (answer_budget),
    else None. Only where the answer is one model turn's text (single_turn, tools): a stateful
    environment's solution is spread over its turns (grid_nav's walk, one move a turn)."""
    if cfg.env_name not in ("single_turn", "tools"):
        return None
    found = answer_budget(samples, tokenizer, cfg.sft.target, cfg.rollout.max_new_tokens)
    return format_answer_budget(found, cfg.rollout.max_new_tokens) if found else None


def format_answer_budget(found: dict, max_new_tokens: int) -> str:
    return (f"rollout.max_new_tokens {max_new_tokens} cuts the gold answer of {found['over']} of "
            f"{found['of']} records (longest {found['longest']} tokens with sft.target and "
            f"end-of-sequence): those can never score; raise rollout.max_new_tokens to at least "
            f"{found['longest']}")
