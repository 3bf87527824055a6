"""Command line: score a JSONL file with one reward, or list the rewards.

    python -m rewards ls
    python -m rewards score --reward iou --param threshold=0.5 --input samples.jsonl

Each input line is {"completion": str, "solution": ..., <other fields>}; each output line is
{"score": float | null}, in input order. `--input -` reads standard input.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, BinaryIO, TextIO

from rewards import REWARDS, get_reward


def _param_value(text: str) -> Any:
    """A --param value: JSON when it parses (0.5, true, null, [1, 2]), else the raw string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_params(pairs: list[str], reward: str) -> dict[str, Any]:
    known = REWARDS.params(reward) if reward in REWARDS else None
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--param expects key=value, got {pair!r}")
        if known is not None and key not in known:
            raise SystemExit(f"reward {reward!r} has no parameter {key!r}; "
                             f"parameters: {', '.join(known) or '(none)'}")
        params[key] = _param_value(value)
        default = known.get(key) if known else None
        if isinstance(default, (int, float)) and not isinstance(default, bool) and (
                isinstance(params[key], bool) or not isinstance(params[key], (int, float))):
            raise SystemExit(f"--param {pair}: {key} must be a number (default {default})")
    return params


def read_records(stream: TextIO | BinaryIO) -> list[dict]:
    records = []
    for lineno, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as e:
            raise SystemExit(f"line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                             f"column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"line {lineno}: not valid JSON ({e})") from None
        if not isinstance(record, dict) or "completion" not in record:
            raise SystemExit(f"line {lineno}: expected an object with a 'completion' key")
        records.append(record)
    return records


def score_records(reward: str, params: dict[str, Any], records: list[dict]) -> list[float | None]:
    """Score records in one batch call: fields become per-sample lists (None where absent)."""
    fn = get_reward(reward)
    names = sorted({k for r in records for k in r} - {"completion", "solution"})
    fields = {name: [r.get(name) for r in records] for name in names}
    return fn([r["completion"] for r in records], [r.get("solution") for r in records],
              **fields, **params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", help="list reward names with one-line docs")
    score = sub.add_parser("score", help="score a JSONL file, one {\"score\": ...} line each")
    score.add_argument("--reward", required=True)
    score.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    score.add_argument("--input", required=True, help="JSONL file, or - for standard input")
    args = parser.parse_args(argv)

    if args.command == "ls":
        width = max(len(name) for name in REWARDS)
        for name in REWARDS:
            low, high = REWARDS.score_range(name)
            print(f"{name:<{width}}  {f'[{low:g}, {high:g}]':<8}  {REWARDS.summary(name)}")
        return 0
    try:
        get_reward(args.reward)
    except KeyError as e:
        raise SystemExit(str(e.args[0])) from None
    params = parse_params(args.param, args.reward)
    try:
        if args.input == "-":
            records = read_records(sys.stdin.buffer)
        else:
            with open(args.input, "rb") as f:  # bytes: a bad byte is named with its line
                records = read_records(f)
    except OSError as e:
        raise SystemExit(f"--input {args.input}: {e.strerror or e}") from None
    except SystemExit as e:
        raise SystemExit(f"{args.input}: {e.code}") from None
    try:
        scores = score_records(args.reward, params, records)
    except ValueError as e:  # a bad parameter value (e.g. an unknown mode)
        raise SystemExit(str(e)) from None
    for value in scores:
        print(json.dumps({"score": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
