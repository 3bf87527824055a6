"""Where a model comes from (`model.path`): one small frozen record per kind, parsed once.

    tiny             the family adapter's offline tiny twin: random weights built in-process
    shape:NAME[:L]   random weights at a published checkpoint's shape (mmrl/models/shapes.py),
                     optionally with L text layers
    DIR              a local Hugging Face checkpoint directory (a run's checkpoint included)
    ORG/NAME         a Hub repository id (transformers downloads it unless HF_HUB_OFFLINE=1)

A kind written as a name, or as `name:argument`, is one entry of `KINDS`: the name -> a function
from the argument to a record with `check`, `build` and `zero3_init` (see `ModelSource`). Nothing
else in mmrl looks at the string.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import torch

    from mmrl.models.base import ModelAdapter

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*|[A-Za-z0-9][\w.-]*")


class ModelSource(Protocol):
    # True: ZeRO-3 may partition the model while it is built (zero.Init), so a model larger
    # than one process's memory never exists whole.
    zero3_init: bool

    def check(self) -> None:
        """Fail before any work, saying what to do, when this machine cannot get the model."""

    def build(self, adapter: ModelAdapter, *, dtype: torch.dtype, attn_implementation: str,
              seed: int = 0, tiny: dict | None = None) -> tuple[Any, Any]:
        """-> (model, processor). `seed` and `tiny` (adapter.tiny overrides) shape a built
        model; a loaded one ignores them."""


@dataclass(frozen=True)
class Tiny:
    """The adapter's tiny twin (tests, smoke runs, CPU learning rows)."""
    zero3_init = False  # its weight init indexes whole tensors: built whole, sharded after

    def check(self) -> None:
        pass

    def build(self, adapter: ModelAdapter, *, dtype: torch.dtype, attn_implementation: str,
              seed: int = 0, tiny: dict | None = None) -> tuple[Any, Any]:
        from mmrl.models.shared_prefix import attn_implementation as attn_of

        model, processor = adapter.tiny(seed=seed, **(tiny or {}))
        model = model.to(dtype)
        if attn_of(model) != attn_implementation:  # tiny models are built with sdpa
            model.set_attn_implementation(attn_implementation)
        return model, processor


@dataclass(frozen=True)
class LocalDir:
    """A Hugging Face checkpoint directory on this machine (a run's checkpoint included)."""
    path: Path
    zero3_init = True

    def check(self) -> None:
        pass

    def build(self, adapter: ModelAdapter, *, dtype: torch.dtype, attn_implementation: str,
              seed: int = 0, tiny: dict | None = None) -> tuple[Any, Any]:
        return adapter.load(str(self.path), dtype=dtype, attn_implementation=attn_implementation)


@dataclass(frozen=True)
class HubId:
    """A Hub repository id; transformers downloads it (or reads its cache)."""
    repo_id: str
    zero3_init = True

    def check(self) -> None:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise FileNotFoundError(
                f"model.path={self.repo_id}: not a local directory and HF_HUB_OFFLINE=1; download "
                f"the checkpoint first (huggingface-cli download {self.repo_id} --local-dir DIR) "
                f"and point model.path at DIR")

    def build(self, adapter: ModelAdapter, *, dtype: torch.dtype, attn_implementation: str,
              seed: int = 0, tiny: dict | None = None) -> tuple[Any, Any]:
        return adapter.load(self.repo_id, dtype=dtype, attn_implementation=attn_implementation)


@dataclass(frozen=True)
class Shape:
    """Random weights at a published checkpoint's shape, built on this process's GPU when there
    is one (an 8B model is never materialised on the host first)."""
    path: str  # "shape:NAME[:LAYERS]", checked by shapes.parse when parsed
    zero3_init = False  # built by its class constructor, which zero.Init does not reach

    def check(self) -> None:
        pass

    def build(self, adapter: ModelAdapter, *, dtype: torch.dtype, attn_implementation: str,
              seed: int = 0, tiny: dict | None = None) -> tuple[Any, Any]:
        from mmrl.models import shapes

        return shapes.build_for(self.path, adapter.family, dtype=dtype, seed=seed)


def _shape(argument: str) -> Shape:
    from mmrl.models import shapes

    shapes.parse(f"shape:{argument}")  # an unknown name or layer count fails here
    return Shape(f"shape:{argument}")


def _tiny(argument: str) -> Tiny:
    if argument:
        raise ValueError(f"model.path=tiny:{argument}: tiny takes no argument; its sizes are "
                         f"model.tiny overrides (e.g. model.tiny.hidden_size=128)")
    return Tiny()


# model.path kinds written as a name (or name:argument) -> the record of that kind
KINDS: dict[str, Callable[[str], ModelSource]] = {"tiny": _tiny, "shape": _shape}


def parse(path: str | Path) -> ModelSource:
    """The source `model.path` names. A path that is neither a kind, nor a local directory, nor
    shaped like a Hub id is an error here (the Hub client's own message would not say which)."""
    path = str(path)
    kind, _, argument = path.partition(":")
    if kind in KINDS:
        return KINDS[kind](argument)
    if Path(path).exists():
        return LocalDir(Path(path))
    if _REPO_ID.fullmatch(path):
        return HubId(path)
    raise FileNotFoundError(f"model.path={path}: no such local directory (and not a Hub repo id "
                            f"like Qwen/Qwen2.5-VL-3B-Instruct, nor one of {sorted(KINDS)}); "
                            f"check the path")
