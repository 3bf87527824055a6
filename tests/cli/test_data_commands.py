"""`mmrl data inspect` and `convert` read a file by train's rule (the --format flag, then the
config's data.format where it reads the file, then detection), `convert` prints the train line
to run next, and the CLI prints the cause of a wrapped error."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl import cli

COUNTING = "recipes/counting/config.yaml"


@pytest.fixture
def clevr_file(tmp_path):
    """R1-V's CLEVR counting rows, the counting recipe's source format (r1v)."""
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    rows = [{"problem": f"How many items are there? ({i})",
             "solution": f"<answer> {i % 4} </answer>", "image": "a.png"} for i in range(8)]
    path = tmp_path / "clevr.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_convert_prints_the_train_line_and_inspect_reads_the_result_under_a_recipe(
        tmp_path, clevr_file, capsys):
    out = tmp_path / "converted.jsonl"
    assert cli.main(["data", "convert", str(clevr_file), str(out),
                     "--config", COUNTING]) == 0  # --from detected: r1v
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].strip() == (f"mmrl train {COUNTING} data.format=mmrl "
                                   f"data.train={out.resolve()}")
    assert '"format": "r1v"' in "\n".join(printed)
    # The counting recipe says data.format: r1v; the converted file is native.
    assert cli.main(["data", "inspect", str(out), "--config", COUNTING]) == 0
    text = capsys.readouterr().out
    assert "(format mmrl): 8 records" in text and "malformed records: 0" in text
    assert "note: " in text and "data.format=r1v does not read this file" in text


def test_inspect_detects_a_parquet_file_and_accepts_format_null(tmp_path, capsys):
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    pq.write_table(pa.Table.from_pylist([{"problem": "How many?", "answer": "3",
                                          "images": [str(tmp_path / "a.png")]}] * 3),
                   tmp_path / "d.parquet")
    for extra in ([], ["--format", "null"]):
        assert cli.main(["data", "inspect", str(tmp_path / "d.parquet"), *extra]) == 0
        assert "(format easyr1): 3 records" in capsys.readouterr().out


def test_inspect_with_a_config_stops_where_train_would(tmp_path, capsys):
    """The video_qa recipe routes accuracy to Video-R1's problem types; its synthetic set's
    records are task video_qa: train stops at start, and inspect says the same."""
    rows = [{"task": "video_qa", "prompt": "Which?", "solution": "A"}] * 4
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["data", "inspect", str(path), "--config",
                     "recipes/video_qa/config.yaml"]) == 1
    text = capsys.readouterr().out
    assert "problem: eval.metric_reward 'accuracy' can score none" in text
    assert "['multiple_choice', 'numerical']" in text and "['video_qa']" in text


def test_the_cli_prints_the_cause_of_a_wrapped_error(capsys, monkeypatch):
    def train(args):
        try:
            raise FileNotFoundError("a.png: file not found")
        except FileNotFoundError as e:
            raise RuntimeError("every training sample failed to load") from e

    monkeypatch.setattr(cli, "cmd_validate", train)
    assert cli.main(["validate", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "mmrl: error: every training sample failed to load\n  caused by: a.png: file not found" \
        in err


def test_generate_names_the_generators_parameters_for_an_unknown_one(tmp_path, capsys):
    assert cli.main(["data", "generate", "counting", str(tmp_path / "c"), "n=24"]) != 0
    message = capsys.readouterr().err
    assert "data generator 'counting' takes no parameter 'n'" in message
    assert "n_train, n_eval, seed" in message and not (tmp_path / "c").exists()


def test_generate_reads_negative_numbers_and_lists(tmp_path, monkeypatch):
    """k=v values parse as JSON: a negative number reached the generator as the text "-7"
    (a TypeError deep inside); lists and booleans too, anything else stays text. A user's own
    generator ("module:function") shows exactly what it was given."""
    (tmp_path / "my_gen.py").write_text(
        "import json, pathlib\n"
        "def make(out_dir, inset=0, at=None, tools=True, name='', n=0):\n"
        "    kw = dict(inset=inset, at=at, tools=tools, name=name, n=n)\n"
        "    pathlib.Path(out_dir).mkdir(parents=True)\n"
        "    (pathlib.Path(out_dir) / 'kw.json').write_text(json.dumps(kw))\n"
        "    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "v"
    assert cli.main(["data", "generate", "my_gen:make", str(out), "inset=-7", "at=[0,4.5]",
                     "tools=false", "name=x", "n=3"]) == 0
    assert json.loads((out / "kw.json").read_text()) == {
        "inset": -7, "at": [0, 4.5], "tools": False, "name": "x", "n": 3}
