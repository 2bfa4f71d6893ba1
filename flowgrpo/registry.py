"""Name -> factory registries shared by every extension kind (samplers, losses, rewards, ...).

One lookup per kind: an unknown name raises :class:`UnknownNameError` listing the valid names, so
a typo in a config fails at load time with the fix in the message.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

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


def bind_params(target: Callable[..., Any], params: dict, skip: int = 0) -> None:
    """Check, without calling it, that ``target`` accepts ``params`` as keyword arguments.

    Args:
        target: a function or class (its ``__init__`` without ``self``).
        params: the keyword arguments from a config.
        skip: leading positional parameters the caller supplies itself (e.g. ``logp``).

    Raises:
        TypeError: one line naming the unknown parameter, the closest valid one and every valid
            one.
    """
    signature = inspect.signature(target)
    accepted = list(signature.parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted):
        return
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    valid = [p.name for p in accepted if p.kind in keyword]
    unknown = [name for name in params if name not in valid]
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        name = getattr(target, "__name__", repr(target))
        raise TypeError(f"{name} got an unknown parameter {unknown[0]!r}{hint}; valid: "
                        f"{', '.join(valid) or 'none'}")
