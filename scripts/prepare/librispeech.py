"""LibriSpeech split dir -> mmrl JSONL (ASR).

    python scripts/prepare/librispeech.py /data/LibriSpeech/test-clean data/librispeech/eval.jsonl

Walks SPEAKER/CHAPTER/*.trans.txt; one record per utterance with the flac path (absolute) and the
lower-cased transcript as solution. Audio is decoded (and resampled to 16 kHz) at training time.
"""
import json
import sys
from pathlib import Path

PROMPT = "Transcribe the speech. Answer with the transcript in <answer></answer>."


def main(split_dir: str, out: str) -> int:
    root, records = Path(split_dir), []
    for trans in sorted(root.glob("*/*/*.trans.txt")):
        for line in trans.read_text().splitlines():
            utt, _, text = line.partition(" ")
            audio = trans.parent / f"{utt}.flac"
            if not audio.is_file():
                print(f"{trans}: missing {audio.name}", file=sys.stderr)
                continue
            records.append({"id": utt, "task": "asr", "audios": [str(audio.resolve())],
                            "prompt": PROMPT, "solution": text.lower()})
    if not records:
        print(f"no */*/*.trans.txt under {root}", file=sys.stderr)
        return 1
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} utterances -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
