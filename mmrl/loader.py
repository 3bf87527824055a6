"""`load("pkg.mod:attr", kind)`: the one importer of user code a config names by path (an
advantage estimator, a data format, a model family, a data generator: every registry's escape
hatch).

A leaf: it imports only the standard library (and `mmrl/__init__.py` imports nothing), so
mmrl.algos, which is pure torch, may import it too; tests/test_import_graph.py allows algos
exactly such stdlib-only leaves. rewards/registry.py keeps its own copy of `load` for rewards,
because rewards/ imports nothing from mmrl (it is usable on its own);
tests/rewards/test_loader.py holds the two to the same behaviour.
"""
from __future__ import annotations

import importlib
from typing import Any


def is_import_path(name: str) -> bool:
    """Whether `name` is written "pkg.mod:attr" rather than as a registered name."""
    return ":" in name


def load(name: str, kind: str) -> Any:
    """The attribute `attr` of module `pkg.mod`, for `name` = "pkg.mod:attr". A KeyError names
    the `kind` of object, the path and why it could not be imported.

    >>> load("json:dumps", "reward")([1])
    '[1]'
    >>> load("json:nope", "reward")
    Traceback (most recent call last):
    ...
    KeyError: "reward 'json:nope': cannot import (module 'json' has no attribute 'nope')"
    """
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"{kind} {name!r}: cannot import ({e})") from e
