"""Name -> factory registries shared by every extension kind (samplers, losses, rewards, ...).

One lookup per kind: an unknown name raises :class:`UnknownNameError` listing the valid names, so
a typo in a config fails at load time with the fix in the message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """Raised when a registry is asked for a name it does not hold."""


class Registry(Generic[T]):
    """A named collection of factories (functions or classes) of one kind.

    Args:
        kind: what the registry holds, used in error messages ("sampler", "loss", ...).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; registering a name twice is an error."""

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the factory registered as ``name``."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
