"""model.path parsed once into a typed source: the tiny twin, a local checkpoint directory or a
Hub id; each says whether this machine can get it (`check`) and builds (model, processor)."""
import pytest
import torch

from mmrl.models import get_adapter, source
from mmrl.models.shared_prefix import attn_implementation


def test_each_kind_of_path_parses_to_its_record(tmp_path):
    assert source.parse("tiny") == source.Tiny()
    assert source.parse("shape:qwen2_5_vl-7b:2") == source.Shape("shape:qwen2_5_vl-7b:2")
    assert source.parse(tmp_path) == source.LocalDir(tmp_path)
    assert source.parse("Qwen/Qwen2.5-VL-3B-Instruct") == source.HubId("Qwen/Qwen2.5-VL-3B-Instruct")
    assert source.Tiny.zero3_init is source.Shape.zero3_init is False
    assert source.LocalDir.zero3_init is source.HubId.zero3_init is True


def test_bad_paths_say_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="tiny takes no argument.*model.tiny"):
        source.parse("tiny:7b")
    with pytest.raises(ValueError, match="unknown shape 'qwen2_5_vl-9b'"):
        source.parse("shape:qwen2_5_vl-9b")
    with pytest.raises(FileNotFoundError, match="no such local directory"):
        source.parse("./models/Qwen2.5-VL-3B-Instruc")
    hub = source.parse("Qwen/Qwen2.5-VL-3B-Instruct")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="download the checkpoint first"):
        hub.check()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.check()  # online: transformers downloads it


def test_a_new_kind_is_one_table_entry(monkeypatch):
    monkeypatch.setitem(source.KINDS, "mirror", lambda name: ("mirror", name))
    assert source.parse("mirror:qwen2_5_vl-7b") == ("mirror", "qwen2_5_vl-7b")


def test_tiny_builds_the_adapters_twin_and_a_directory_loads_it_back(tmp_path):
    adapter = get_adapter("qwen2_5_vl")
    model, processor = source.Tiny().build(adapter, dtype=torch.float32,
                                           attn_implementation="eager", seed=3)
    twin, _ = adapter.tiny(seed=3)
    assert attn_implementation(model) == "eager"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 twin.state_dict().values()))
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded, _ = source.parse(tmp_path).build(adapter, dtype=torch.float32,
                                             attn_implementation="sdpa")
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values()))
