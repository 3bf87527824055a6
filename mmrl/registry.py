"""Name -> object registries. `Registry.get("pkg.mod:attr")` imports user code without registering it."""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from mmrl.loader import is_import_path, load

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if is_import_path(name):  # escape hatch: "my_pkg.my_mod:my_fn"
            return load(name, self.kind)
        raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, Any]]:
        return [(n, self._items[n]) for n in self.names()]
