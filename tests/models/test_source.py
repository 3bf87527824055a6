"""model.path parsed once into a typed source: the tiny twin, a local checkpoint directory or a
Hub id; each says whether this machine can get it (`check`) and builds (model, processor)."""
import pytest
import torch

from mmrl.models import get_adapter, source
from mmrl.models.shared_prefix import attn_implementation


def test_each_kind_of_path_parses_to_its_record(tmp_path):
    assert source.parse("tiny") == source.Tiny()
    assert source.parse(tmp_path) == source.LocalDir(tmp_path)
    assert source.parse("Qwen/Qwen2.5-VL-3B-Instruct") == source.HubId("Qwen/Qwen2.5-VL-3B-Instruct")
    assert source.Tiny.zero3_init is False and source.LocalDir.zero3_init is source.HubId.zero3_init


def test_bad_paths_say_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="tiny takes no argument.*model.tiny"):
        source.parse("tiny:7b")
    with pytest.raises(FileNotFoundError, match="no such local directory"):
        source.parse("./models/Qwen2.5-VL-3B-Instruc")
    hub = source.parse("Qwen/Qwen2.5-VL-3B-Instruct")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="download the checkpoint first"):
        hub.check()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.check()  # online: transformers downloads it


def test_a_new_kind_is_one_table_entry(monkeypatch):
    monkeypatch.setitem(source.KINDS, "shape", lambda name: ("shape", name))
    assert source.parse("shape:qwen2_5_vl-7b") == ("shape", "qwen2_5_vl-7b")


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
