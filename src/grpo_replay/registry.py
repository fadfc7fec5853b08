"""Name-keyed registries (priorities, compositions, loss aggregations, advantage estimators).

One registry per concept, one call signature per registry, a duplicate name is an error, and every call site
looks the function up here, so a name accepted by the config is exactly a name the code can run.
"""
from __future__ import annotations

import inspect
from typing import Callable, Generic, Sequence, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind by name. Invariants: names are unique; every registered function takes exactly the
    registry's declared positional parameters (its one signature), checked at registration."""

    def __init__(self, kind: str, params: Sequence[str]):
        self.kind = kind
        self.params = tuple(params)
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}")
            got = tuple(inspect.signature(fn).parameters)
            if len(got) != len(self.params):
                raise TypeError(
                    f"{self.kind} {name!r} takes ({', '.join(got)}); every {self.kind} takes ({', '.join(self.params)})"
                )
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
