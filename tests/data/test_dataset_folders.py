"""Dataset folders as a Hub dataset repository is downloaded (README.md + data/<split>-*.parquet):
one split at a time, the train split for data.train, never merged."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmrl import config
from mmrl.data.prepare import build_datasets
from mmrl.data.schema import RecordError, load_samples


def _rows(split: str, n: int) -> list[dict]:
    return [{"problem": f"{split} question {i}", "answer": str(i)} for i in range(n)]


@pytest.fixture
def hub_repo(tmp_path):
    """What downloading a dataset repository gives: a card and one Parquet shard per split."""
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "README.md").write_text("---\nlicense: mit\n---\n# A dataset\n")
    for split, n in (("train", 5), ("validation", 3), ("test", 2)):
        pq.write_table(pa.Table.from_pylist(_rows(split, n)),
                       repo / "data" / f"{split}-00000-of-00001.parquet")
    return repo


def test_a_hub_folder_gives_its_train_split_to_data_train(hub_repo):
    for path in (hub_repo, hub_repo / "data"):  # the repository, or its data/ folder
        samples = load_samples(path, default_split="train")
        assert len(samples) == 5, "the test and validation splits must not train"
        assert {s.messages[0]["content"][-1]["text"].split()[0] for s in samples} == {"train"}


def test_a_named_split_is_read_alone(hub_repo):
    assert len(load_samples(f"{hub_repo}:validation")) == 3
    assert len(load_samples(f"{hub_repo}/data:test")) == 2
    assert len(load_samples(f"{hub_repo}:dev")) == 3  # the datasets library's word for it


def test_several_splits_without_a_name_is_an_error_listing_them(hub_repo):
    with pytest.raises(RecordError) as e:
        load_samples(hub_repo)
    msg = str(e.value)
    assert "holds several splits: train (1 file), validation (1 file), test (1 file)" in msg
    assert f"{hub_repo}:train" in msg
    with pytest.raises(RecordError, match="no split 'dev_b'; it holds train"):
        load_samples(f"{hub_repo}:dev_b")

def test_the_readme_configs_name_the_splits(tmp_path):
    repo = tmp_path / "repo"
    (repo / "files").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_rows("a", 4)), repo / "files" / "first.parquet")
    pq.write_table(pa.Table.from_pylist(_rows("b", 2)), repo / "files" / "second.parquet")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: files/first.parquet\n  - split: test\n    path: files/second*\n---\n")
    assert len(load_samples(repo, default_split="train")) == 4
    assert len(load_samples(f"{repo}:test")) == 2


def test_data_train_and_eval_from_one_folder_through_the_config(hub_repo):
    cfg = config.load(None, [f"data.train={hub_repo}", f"data.eval={hub_repo}:test"])
    train, evals = build_datasets(cfg, 28)
    assert (len(train), len(evals)) == (5, 2) and train.format == "easyr1"
    cfg = config.load(None, [f"data.train={hub_repo}", f"data.eval={hub_repo}"])
    with pytest.raises(RecordError, match="holds several splits"):
        build_datasets(cfg, 28)  # eval has no default split: it must be named


def test_a_datasetdict_saved_to_disk_is_read_split_by_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows("train", 4)),
                               "test": datasets.Dataset.from_list(_rows("test", 2))})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert len(load_samples(tmp_path / "dd", default_split="train")) == 4
    assert len(load_samples(f"{tmp_path / 'dd'}:test")) == 2
