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


def test_generate_reads_negative_numbers_and_lists(tmp_path):
    """k=v values parse as JSON: a negative number reached the generator as the text "-7"
    (a TypeError deep inside); lists and booleans too, anything else stays text."""
    import numpy as np
    from mmrl.data.media import load_video
    from mmrl.data.schema import load_samples
    out = tmp_path / "v"
    assert cli.main(["data", "generate", "video_search", str(out), "n_train=2", "n_eval=0",
                     "seconds=8", "fps=2", "size=28", "card_seconds=3", "flash_frames=1",
                     "flash_inset=-7", "card_at=[0,4.5]", "tools=false"]) == 0
    for s in load_samples(out / "train.jsonl"):
        assert s.fields["card_span"][0] in (0, 4.5) and "tools" not in s.fields
        frame = load_video(s.videos[0], fps=2.0).frames[round(s.fields["flash_span"][0] * 2)]
        corner = frame[:5, :5].reshape(-1, 3).astype(float).mean(0)  # outside the card
        assert np.abs(corner - 235).max() > 60  # -7 = -size/4: the flash fills the frame
