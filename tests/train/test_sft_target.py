"""The SFT warm-up's target: `{solution}` and any record field fill it; a field the record lacks
is an error naming the field, the record and the fields it has."""
from __future__ import annotations

import pytest

from mmrl.config import SFTConfig
from mmrl.train.sft import target_text
from mmrl.types import Sample


def _sample(**fields) -> Sample:
    return Sample(id="vs-7", messages=[], solution="B", fields=fields, source="train.jsonl:8")


def test_record_fields_fill_the_target():
    sc = SFTConfig(target='<tool_call>{{"name": "crop", "arguments": {{"bbox_2d": {patch_box}}}}}'
                          '</tool_call><answer>{solution}</answer>')
    assert target_text(sc, _sample(patch_box=[4, 8, 28, 32])) == (
        '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [4, 8, 28, 32]}}</tool_call>'
        '<answer>B</answer>')


def test_a_field_the_record_lacks_is_named():
    with pytest.raises(ValueError, match=r"sft.target names \{patch_box\}, which record vs-7 "
                                         r"\(train.jsonl:8\) does not have; its fields: task"):
        target_text(SFTConfig(target="{patch_box}"), _sample(task="visual_search"))
