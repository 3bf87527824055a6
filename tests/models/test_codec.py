"""The Codec: one object for a family's adapter and its processor. No function in mmrl/ takes
the pair; the codec's facts are the ones the adapter and processor give; the engines' capability
attributes say what the family-name tables said; and every registered family is registered in
every place docs/models.md "Adding a family" lists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.models import MODELS, get_adapter
from mmrl.models.base import ModelAdapter
from mmrl.models.codec import Codec
from mmrl.models.shapes import SHAPES
from mmrl.models.tiny_tokenizer import tiny_tokenizer
from mmrl.types import Sample
from rewards.boxes import COORDS

ROOT = Path(__file__).parents[2]
# The one function allowed to take both: the codec's own constructor.
ALLOWED = {"mmrl/models/codec.py:Codec.__init__"}


def pair_functions(trees: dict[str, ast.Module]) -> list[str]:
    """`file:Class.function` of every function with both an `adapter` and a `processor` parameter."""
    found = []
    for rel, tree in trees.items():
        def visit(node, owner):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                    if {"adapter", "processor"} <= names:
                        found.append(f"{rel}:{owner}{child.name}")
                    visit(child, owner)
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{owner}{child.name}.")
                else:
                    visit(child, owner)
        visit(tree, "")
    return sorted(found)


def test_the_pair_check_sees_a_function_taking_both():
    tree = ast.parse("def f(adapter, processor): ...\n"
                     "class A:\n    def g(self, x, *, adapter=None, processor=None): ...\n"
                     "def h(codec, processor): ...\n")
    assert pair_functions({"a.py": tree}) == ["a.py:A.g", "a.py:f"]


def test_no_function_in_mmrl_takes_an_adapter_and_a_processor():
    trees = {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(), str(p))
             for p in sorted((ROOT / "mmrl").rglob("*.py"))}
    assert set(pair_functions(trees)) - ALLOWED == set(), "take the Codec (mmrl/models/codec.py)"


@pytest.fixture(scope="module")
def tiny():
    adapter = get_adapter("qwen2_5_vl")
    model, codec = Codec.tiny(adapter, seed=0, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    return adapter, model, codec


def test_the_codec_gives_the_adapters_and_processors_facts(tiny):
    adapter, _, codec = tiny
    processor = codec.processor
    assert codec.pad_id == processor.tokenizer.pad_token_id
    assert codec.placeholder_ids == adapter.placeholder_token_ids(processor)
    assert codec.tokenizer is processor.tokenizer and codec.family == "qwen2_5_vl"
    assert (codec.image_factor, codec.box_coords, codec.patch_size) == (28, "resized", 14)
    assert codec.pixel_budget() == (28 * 28 * 4, 28 * 28 * 64)
    assert codec.decode([codec.tokenizer.convert_tokens_to_ids("<|im_end|>")],
                        skip_special_tokens=False) == "<|im_end|>"


def test_codec_features_are_the_adapters_bit_for_bit(tiny):
    adapter, _, codec = tiny
    sample = Sample(id="s", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What is it?"}]}])
    image = Image.new("RGB", (84, 56), "red")
    ours = codec.prompt_features(sample, [image]).tensors
    theirs = adapter.prompt_features(codec.processor, sample, [image]).tensors
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_toolbox_factor_is_the_codecs_for_every_family():
    """The Toolbox used to work the factor out of the processor (patch x merge); the codec's
    image factor is the adapter's, and they agree for every family."""
    for name in MODELS.names():
        adapter = get_adapter(name)
        tok = tiny_tokenizer()
        processor = adapter.tiny_processor(tok, adapter.tiny_model_config(tok))
        ip = getattr(processor, "image_processor", None)
        derived = int(getattr(ip, "patch_size", 14) or 14) * int(getattr(ip, "merge_size", 2) or 2)
        assert Codec(adapter, processor).image_factor == derived, name


def test_engine_capabilities_say_what_the_family_tables_said():
    # config_rules.VLLM_VIDEO_FAMILIES and rollout/worker_ext._TRAINER_ROPE before the codec
    video = {n for n in MODELS.names() if get_adapter(n).vllm_video}
    assert video == {"qwen2_vl", "qwen2_5_vl"}
    rope = {n: get_adapter(n).trainer_rope for n in MODELS.names() if get_adapter(n).trainer_rope}
    assert rope == {"qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel"),
                    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
                                   "Qwen2_5_VLModel")}


# ---------------------------------------------------------------- adding a family -------------
CAPABILITIES = ("vllm_video", "trainer_rope")  # declared by the family's class itself
PLACES = ("mmrl/models/<family>.py", "mmrl/models/__init__.py", "tiny_model_config",
          "tiny_processor", "module_prefixes", "placeholder_attrs", "image_factor", "box_coords",
          "vllm_video", "trainer_rope", "mmrl/rollout/vllm_weights.py", "mmrl/models/shapes.py",
          "docs/models.md")


def _section() -> str:
    text = (ROOT / "docs/models.md").read_text()
    start = text.index("## Adding a family")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_docs_list_every_place_a_family_is_registered():
    missing = [p for p in PLACES if p not in _section()]
    assert missing == []


@pytest.mark.parametrize("name", MODELS.names())
def test_every_registered_family_is_in_every_place(name):
    adapter = get_adapter(name)
    cls = type(adapter)
    assert adapter.family == name
    assert cls.__module__ == f"mmrl.models.{name}", "one module per family, named as registered"
    for method in ("tiny_model_config", "tiny_processor"):  # the tiny twin
        assert getattr(cls, method) is not getattr(ModelAdapter, method), method
    missing = [c for c in CAPABILITIES if c not in vars(cls)]  # not inherited by accident
    assert missing == [], f"{cls.__name__} must say {missing} itself"
    if not adapter.vllm_video:
        assert "vllm_video_refused" in vars(cls) or cls.vllm_video_refused, "say why"
    towers = {"images": "vision", "videos": "vision", "audios": "audio"}
    assert {"language"} | {towers[k] for k in adapter.media_kinds} <= set(adapter.module_prefixes)
    assert adapter.box_coords in COORDS and adapter.image_factor > 0
    assert any(s.family == name for s in SHAPES.values()), "a real shape in models/shapes.py"
    assert f"`{name}`" in (ROOT / "docs/models.md").read_text()


@pytest.mark.parametrize("name", MODELS.names())
def test_every_family_twin_renders_one_placeholder_per_media_item(name):
    """The chat template facts: each media kind's placeholder is a token of the twin's
    vocabulary, named by `placeholder_attrs`, written once per item by the template."""
    adapter = get_adapter(name)
    tok = tiny_tokenizer()
    processor = adapter.tiny_processor(tok, adapter.tiny_model_config(tok))
    ids = set(Codec(adapter, processor).placeholder_ids)
    vocab = tok.get_vocab()
    for kind in adapter.media_kinds:
        token = getattr(processor, f"{kind[:-1]}_token")
        assert vocab.get(token) in ids, (kind, token)
        messages = [{"role": "user", "content": [{"type": kind[:-1]}, {"type": kind[:-1]},
                                                 {"type": "text", "text": "?"}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert len(re.findall(re.escape(token), text)) == 2, (kind, text)
    for attr in adapter.placeholder_attrs:
        token = getattr(tok, attr, None) or getattr(processor, attr, None)
        assert isinstance(token, str) and vocab[token] in ids, attr
