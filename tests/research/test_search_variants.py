"""The search rows' generator moved to research (research/search_variants.py, issue #58 item 4):
the product's `visual_search` / `video_search` take only what a recipe sets, and the rows' draws,
made as the harness makes them (`mmrl data generate research.search_variants:NAME k=v`, every
value JSON as learning_table.prepare_generated writes it), are byte for byte what the product's
generators wrote with the layout knobs before the move (hashes pinned from that code)."""
from __future__ import annotations

import hashlib
import inspect
import json
import sys
from pathlib import Path

import pytest

from mmrl import cli
from mmrl.data.synthetic import GENERATORS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "research"))
import learning_rows  # noqa: E402

# sha256 over the .jsonl and .png files (by name, sorted) of each row's draw with n_train=6,
# n_eval=2, made by the product generators of main at 4a810b3, before the knobs moved.
BEFORE = {"visual_search": "86ea33869b40cea922a0388ecb4be478855d1961c962b94c7169727f5fe9d431",
          "video_search": "be57be4a973fe12f00a99f08d125ee1f06584dc2ce5c754ecf9a67bf8e2f4250"}


@pytest.mark.parametrize("row", sorted(BEFORE))
def test_the_rows_draws_are_byte_identical_to_before_the_move(row, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # the harness's PYTHONPATH: research.* imports
    task, args = learning_rows.GENERATED[row]
    assert task == f"research.search_variants:{row}"
    args = {**args, "n_train": 6, "n_eval": 2}
    assert cli.main(["data", "generate", task, str(tmp_path), *(
        f"{k}={json.dumps(v) if isinstance(v, (bool, list, dict)) else v}"
        for k, v in args.items())]) == 0
    h = hashlib.sha256()
    for p in sorted(tmp_path.rglob("*")):
        if p.suffix in (".jsonl", ".png"):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    assert h.hexdigest() == BEFORE[row]


def test_the_product_generators_take_only_the_recipe_knobs():
    """What `mmrl data generate` lists for the two search tasks: no research layout knob."""
    research_only = {"grid", "seen", "prompt", "card_at", "balance_card_at", "flash_inset",
                     "hide_from"}
    for name in ("visual_search", "video_search"):
        params = set(inspect.signature(GENERATORS.get(name)).parameters)
        assert not params & research_only, name
    assert len(inspect.signature(GENERATORS.get("visual_search")).parameters) == 9
    assert len(inspect.signature(GENERATORS.get("video_search")).parameters) == 11
