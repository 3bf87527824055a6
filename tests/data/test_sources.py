"""Streaming dataset input: Parquet files and shard directories by row group, Arrow datasets
lazily, format detection from column names, block-shuffled sampling."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl.data import formats  # noqa: F401  (registers the adapters)
from mmrl.data.detect import detect_format
from mmrl.data.schema import LazySamples, load_samples
from mmrl.data.sources import ParquetTable, open_table
from mmrl.train.setup import PromptSampler


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (i % 256, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def easyr1_rows(n: int, start: int = 0) -> list[dict]:
    return [{"problem": f"<image>How many squares? ({i})", "answer": str(i % 4 + 1),
             "images": [{"bytes": _png(i), "path": None}]} for i in range(start, start + n)]


def write_shards(root, rows_per_shard=(5, 7), row_group_size=3):
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for k, n in enumerate(rows_per_shard):
        pq.write_table(pa.Table.from_pylist(easyr1_rows(n, start)),
                       root / f"train-{k:05d}-of-{len(rows_per_shard):05d}.parquet",
                       row_group_size=row_group_size)
        start += n
    return root


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    return tmp_path / "embedded"


def test_shard_directory_reads_rows_by_row_group_and_names_file_and_row(tmp_path):
    table = open_table(write_shards(tmp_path / "shards"))
    assert isinstance(table, ParquetTable) and len(table) == 12
    assert table.blocks == [3, 2, 3, 3, 1]  # row groups of 3 per shard: 5 -> 3+2, 7 -> 3+3+1
    assert table.columns == ["problem", "answer", "images"]
    row, source = table[6]  # second shard, its row 1
    assert row["problem"] == "<image>How many squares? (6)"
    assert source.endswith("train-00001-of-00002.parquet[1]")
    assert table._cached[0] == 2  # only that row group was read
    assert [table[i][0]["answer"] for i in range(12)] == [str(i % 4 + 1) for i in range(12)]


def test_easyr1_shards_load_without_format_and_decode_media_only_when_drawn(tmp_path, embedded):
    samples = load_samples(write_shards(tmp_path / "shards"), fmt=None)
    assert isinstance(samples, LazySamples) and len(samples) == 12
    assert not embedded.exists() or not any(embedded.iterdir())  # nothing decoded at load time
    s = samples[9]
    assert s.solution == str(9 % 4 + 1) and s.task == "vqa"
    assert s.messages[0]["content"][0] == {"type": "image"}
    assert [p.name for p in embedded.iterdir()] == [s.images[0].rsplit("/", 1)[-1]]
    assert Image.open(s.images[0]).getpixel((0, 0)) == (9, 0, 0)
    assert [x.id for x in samples[2:4]] == [samples[2].id, samples[3].id]
    assert len(load_samples(tmp_path / "shards", fmt=None, max_samples=4)) == 4


def test_single_parquet_file_matches_the_jsonl_reading(tmp_path, embedded):
    rows = [{"prompt": f"q{i}", "solution": str(i), "task": "vqa"} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lazy, eager = load_samples(tmp_path / "d.parquet", None), load_samples(tmp_path / "d.jsonl", None)
    assert [(s.messages, s.solution, s.task) for s in lazy] == \
           [(s.messages, s.solution, s.task) for s in eager]


def test_arrow_save_to_disk_is_read_lazily_with_detected_format(tmp_path, embedded):
    datasets = pytest.importorskip("datasets")
    rows = [{"problem": f"count {i}", "solution": f"<answer> {i} </answer>",
             "image": Image.new("RGB", (8, 8), (i, 0, 0))} for i in range(5)]
    ds = datasets.Dataset.from_list(rows, features=datasets.Features(
        {"problem": datasets.Value("string"), "solution": datasets.Value("string"),
         "image": datasets.Image()}))
    ds.save_to_disk(str(tmp_path / "arrow"))
    samples = load_samples(tmp_path / "arrow", fmt=None)  # problem/solution: r1v
    assert isinstance(samples, LazySamples) and len(samples) == 5
    assert samples.blocks is None
    assert samples[3].solution == "3" and Image.open(samples[3].images[0]).getpixel((0, 0)) == (3, 0, 0)


@pytest.mark.parametrize("columns, fmt", [
    (["problem", "answer", "images"], "easyr1"),
    (["problem", "solution", "image"], "r1v"),
    (["conversations", "image"], "vlm_r1"),
    (["problem_type", "problem", "options", "solution", "path", "data_type"], "video_r1"),
    (["audio_path", "question_text", "multi_choice", "answer"], "r1_aqa"),
    (["video", "duration", "timestamp", "sentence"], "time_r1"),
    (["id", "prompt", "images", "solution"], "mmrl"),
])
def test_detect_format(columns, fmt):
    assert detect_format(columns, "x.parquet") == fmt


def test_detect_format_names_the_columns_when_unknown():
    with pytest.raises(ValueError, match=r"x.parquet: cannot tell .*\['a', 'b'\].*set data.format"):
        detect_format(["b", "a"], "x.parquet")


def test_block_sampler_visits_every_index_once_per_epoch_in_runs_of_a_block():
    blocks = [3, 2, 3, 3, 1]
    s = PromptSampler(12, seed=0, blocks=blocks)
    epoch = [s.next() for _ in range(12)]
    assert sorted(epoch) == list(range(12))
    starts = [0, 3, 5, 8, 11, 12]
    group = [next(g for g in range(5) if starts[g] <= i < starts[g + 1]) for i in epoch]
    assert sum(a != b for a, b in zip(group, group[1:])) == 4  # 5 blocks: 4 switches
    second = [s.next() for _ in range(12)]
    assert sorted(second) == list(range(12)) and second != epoch
    resumed = PromptSampler(12, seed=0, blocks=blocks)
    resumed.load_state_dict({"epoch": 1, "pos": 0})
    assert [resumed.next() for _ in range(12)] == second


def test_missing_path_that_is_no_cached_dataset_names_it(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="nobody/nothing: not a path, and not a dataset"):
        open_table("nobody/nothing")


def test_dataset_name_streams_the_parquet_shards_of_a_hub_cache_snapshot(tmp_path, monkeypatch,
                                                                          embedded):
    """`data.train: org/name` (split train) or `org/name:test`: the layout huggingface_hub's cache
    has after `snapshot_download` / `load_dataset` of a Parquet dataset (EasyR1's sets are)."""
    hub = pytest.importorskip("huggingface_hub")
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "datasets--org--toy"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    data = repo / "snapshots" / rev / "data"
    data.mkdir(parents=True)
    for split, n in (("train", 5), ("test", 2)):
        pq.write_table(pa.Table.from_pylist(easyr1_rows(n)), data / f"{split}-00000-of-00001.parquet")
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    train, test = load_samples("org/toy", None), load_samples("org/toy:test", None)
    assert (len(train), len(test)) == (5, 2) and isinstance(train, LazySamples)
    assert train[4].solution == "1" and "train-00000-of-00001.parquet[4]" in train[4].source
