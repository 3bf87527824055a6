"""Name -> reward function registry, with each reward's documented score range.

Kept inside `rewards/` (not `mmrl.registry`) because this package imports nothing from `mmrl`.
`get_reward("pkg.mod:fn")` imports a user's reward without registering it.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Iterator

RewardFn = Callable[..., list]


class RewardRegistry:
    """A mapping name -> plain reward function (`REWARDS["iou"]`, `"iou" in REWARDS`, iteration)."""

    def __init__(self) -> None:
        self._fns: dict[str, RewardFn] = {}
        self._ranges: dict[str, tuple[float, float]] = {}

    def register(self, name: str, *, low: float = 0.0, high: float = 1.0
                 ) -> Callable[[RewardFn], RewardFn]:
        """Decorator: register `fn` under `name`; scores are documented to lie in [low, high]."""

        def deco(fn: RewardFn) -> RewardFn:
            old = self._fns.get(name)
            if old is not None and old is not fn and not _same_source(old, fn):
                raise KeyError(f"reward {name!r} is already registered")
            self._fns[name] = fn
            self._ranges[name] = (low, high)
            return fn

        return deco

    def get(self, name: str) -> RewardFn:
        if name in self._fns:
            return self._fns[name]
        if ":" in name:  # escape hatch: "my_pkg.my_mod:my_reward"
            return load(name, "reward")
        raise KeyError(f"unknown reward {name!r}; known: {', '.join(self.names())}")

    def names(self) -> list[str]:
        return sorted(self._fns)

    def score_range(self, name: str) -> tuple[float, float]:
        """The documented [low, high] of a registered reward's scores."""
        return self._ranges[name]

    def params(self, name: str) -> dict[str, object]:
        """Keyword parameters (name -> default) a config may bind; no call needed."""
        sig = inspect.signature(self.get(name))
        return {p.name: p.default for p in sig.parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def summary(self, name: str) -> str:
        """The first line of the reward's docstring."""
        doc = inspect.getdoc(self.get(name)) or ""
        return doc.splitlines()[0] if doc else ""

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __getitem__(self, name: str) -> RewardFn:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._fns)

    def keys(self) -> list[str]:
        return self.names()

    def items(self) -> list[tuple[str, RewardFn]]:
        return [(n, self._fns[n]) for n in self.names()]


def load(name: str, kind: str) -> Any:
    """mmrl/loader.py's `load`, copied: rewards/ imports nothing from mmrl
    (tests/rewards/test_loader.py holds the two to the same behaviour)."""
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"{kind} {name!r}: cannot import ({e})") from e


def _same_source(a: RewardFn, b: RewardFn) -> bool:
    """The same function from a re-imported module (importlib.reload, pytest's importlib mode
    collecting one file): replacing it is not a name clash."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (code_a is not None and code_b is not None and a.__qualname__ == b.__qualname__
            and code_a.co_filename == code_b.co_filename)


REWARDS = RewardRegistry()
register = REWARDS.register


def get_reward(name: str) -> RewardFn:
    """The reward function registered as `name` (or imported from "pkg.mod:attr")."""
    return REWARDS.get(name)
