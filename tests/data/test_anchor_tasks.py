"""The anchor-format tasks of mmrl/data/anchor_tasks.py (the learning table writes each recipe's
task in its anchor project's format): converted back with `mmrl data convert`, they are the
native task again, solutions and media alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.data import anchor_tasks
from mmrl.data.formats import convert
from mmrl.data.synthetic import GENERATORS


@pytest.mark.parametrize("recipe", sorted(anchor_tasks.ANCHORS))
def test_anchor_records_convert_back_to_the_native_task(recipe, tmp_path):
    base, fixed, fmt, _ = anchor_tasks.ANCHORS[recipe]
    native = GENERATORS.get(base)(tmp_path / "native", **{**fixed, "n_train": 3, "n_eval": 2})
    want = [json.loads(line) for line in Path(native["train"]).read_text().splitlines()]
    made = GENERATORS.get(f"anchor_{recipe}")(tmp_path / "anchor", n_train=3, n_eval=2)
    assert made["format"] == fmt
    assert not (tmp_path / "anchor" / "train.jsonl").exists()  # only the anchor's file is left
    out = tmp_path / "conv.jsonl"
    convert(fmt, made["train"], out)  # what `mmrl data convert --from FMT` runs
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["solution"] == w["solution"]  # boxes and segments: the same numbers
        for kind in ("images", "videos", "audios"):
            assert [Path(p).name for p in g.get(kind, [])] == \
                   [Path(p).name for p in w.get(kind, [])]
        text = " ".join(c.get("text", "") for m in g["messages"] for c in m["content"]
                        if isinstance(c, dict))
        for option in g.get("options") or []:  # listed once, by the anchor's template
            assert text.count(option) == 1, text
