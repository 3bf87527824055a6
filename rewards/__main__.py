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
from typing import Any, TextIO

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
    return params


def read_records(stream: TextIO) -> list[dict]:
    records = []
    for lineno, line in enumerate(stream, 1):
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
    if args.input == "-":
        records = read_records(sys.stdin)
    else:
        with open(args.input, encoding="utf-8") as f:
            records = read_records(f)
    try:
        scores = score_records(args.reward, params, records)
    except ValueError as e:  # a bad parameter value (e.g. an unknown mode)
        raise SystemExit(str(e)) from None
    for value in scores:
        print(json.dumps({"score": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
