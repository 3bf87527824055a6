"""COCO captions annotation JSON -> mmrl JSONL (captioning; every reference kept).

    python scripts/prepare/coco_captions.py captions_val2017.json /data/coco/val2017 out.jsonl
"""
import json
import sys
from pathlib import Path

PROMPT = "Describe the image in one sentence. Answer in <answer></answer>."


def main(annotations: str, image_dir: str, out: str) -> int:
    data = json.loads(Path(annotations).read_text())
    captions: dict[int, list[str]] = {}
    for ann in data["annotations"]:
        captions.setdefault(ann["image_id"], []).append(ann["caption"].strip())
    records = []
    for img in data["images"]:
        refs = captions.get(img["id"])
        if refs:
            records.append({"id": str(img["id"]), "task": "captioning",
                            "images": [str((Path(image_dir) / img["file_name"]).resolve())],
                            "prompt": PROMPT, "solution": refs[:5],
                            "image_size": [img["width"], img["height"]]})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} images -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
