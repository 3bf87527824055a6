"""JSONL files and JSON lists are read by byte offset: opening one keeps 12 bytes a record, not
the records, on every rank; a record is parsed when drawn."""
from __future__ import annotations

import json
import tracemalloc

import pytest

from mmrl.data import json_tables
from mmrl.data.schema import RecordError, load_samples
from mmrl.data.sources import open_table


def _record(i: int) -> dict:
    return {"id": f"r{i}", "task": "counting", "prompt": f"How many squares? ({i}) ünïcödé ✓",
            "images": ["img/0001.png"], "solution": str(i % 4 + 1), "options": ["a", "b"]}


def test_opening_a_jsonl_file_holds_offsets_not_records(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(20_000)))
    tracemalloc.start()
    table = open_table(path)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # As dicts the records took ~3 KB each (60 MB here); offsets and line numbers take 12 bytes.
    assert len(table) == 20_000 and held < 1_000_000
    assert table[12_345] == (_record(12_345), f"{path}:12346")
    samples = load_samples(path)
    assert samples[-1].solution == "4" and samples[-1].source == f"{path}:20000"


def test_blank_lines_keep_line_numbers_and_a_bad_line_is_named_at_open(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_record(0)) + "\n\n" + json.dumps(_record(1)) + "\n")
    assert [src for _, src in open_table(path)] == [f"{path}:1", f"{path}:3"]
    path.write_text(json.dumps(_record(0)) + "\n{not json\n")
    with pytest.raises(RecordError, match=r"d.jsonl:2: not valid JSON"):
        open_table(path)


@pytest.mark.parametrize("chunk", [7, 64, 1 << 22])
def test_a_json_list_is_scanned_in_chunks_with_byte_offsets(tmp_path, monkeypatch, chunk):
    """Chunk ends fall inside strings, numbers and multi-byte characters: every record still
    reads back whole, from its own bytes."""
    monkeypatch.setattr(json_tables, "_CHUNK", chunk)
    records = [_record(i) for i in range(50)] + [{"prompt": "n", "solution": 12345678901234}]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records, indent=1, ensure_ascii=False))
    table = open_table(path)
    assert isinstance(table, json_tables.JsonListTable)
    assert [r for r, _ in table] == records and table[3][1] == f"{path}[3]"
    (tmp_path / "e.json").write_text("[]")
    assert len(open_table(tmp_path / "e.json")) == 0


def test_a_broken_json_list_names_the_record(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[{"prompt": "a", "solution": "1"}, {"prompt": "b", "solution": }]')
    with pytest.raises(RecordError, match=r"d.json\[1\]: not valid JSON"):
        open_table(path)
    path.write_text('[{"prompt": "a", "solution": "1"} {"prompt": "b"}]')
    with pytest.raises(RecordError, match=r"d.json\[0\]: expected ',' or ']'"):
        open_table(path)


def test_json_lines_under_a_json_name_and_split_files_concatenate(tmp_path):
    (tmp_path / "lines.json").write_text(json.dumps(_record(0)) + "\n" + json.dumps(_record(1)))
    assert len(open_table(tmp_path / "lines.json")) == 2
    folder = tmp_path / "set"
    folder.mkdir()
    for k in range(2):
        (folder / f"train-{k}.jsonl").write_text(
            "".join(json.dumps(_record(10 * k + i)) + "\n" for i in range(3)))
    table = open_table(folder)
    assert len(table) == 6 and table[4][0]["id"] == "r11"
