"""Name -> factory registries shared by every extension kind (samplers, losses, rewards, ...).

One lookup per kind: an unknown name raises :class:`UnknownNameError` listing the valid names, so
a typo in a config fails at load time with the fix in the message. Each registry also takes
plug-ins from outside the package (entry points, ``module:attribute`` and ``file.py:attribute``
references; :mod:`flowgrpo.plugins`).
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


BUILTIN = "built-in"
BUILTIN_PACKAGES = ("flowgrpo", "samplers", "reward_models", "pipelines")
"""Top-level packages whose registrations count as built-in."""


def is_reference(name: object) -> bool:
    """Whether a registry name is a ``module:attribute`` or ``file.py:attribute`` reference."""
    return isinstance(name, str) and ":" in name


def short_name(name: str) -> str:
    """The attribute of a reference (``my_rewards.py:sharpness`` -> ``sharpness``), else
    ``name``: how metrics and tables name a plugged-in piece (a callable added from Python,
    ``module:outer.<locals>.fn@7f..``, is ``fn``)."""
    if not is_reference(name):
        return name
    return name.rpartition(":")[2].partition("@")[0].rpartition(".")[2]


def origin_of(obj: Any) -> str:
    """``built-in`` for objects defined in flowgrpo's packages, else ``python (<module>)``."""
    module = getattr(obj, "__module__", None) or ""
    if module.partition(".")[0] in BUILTIN_PACKAGES:
        return BUILTIN
    return f"python ({module or 'unknown module'})"


class UnknownNameError(ValueError):
    """Raised when a registry is asked for a name it does not hold."""


class Registry(Generic[T]):
    """A named collection of factories (functions or classes) of one kind.

    Besides the names registered in code, a registry holds the entry points of installed
    distributions (group ``flowgrpo.<kind>s``, listed without importing them) and resolves
    ``module:attribute`` / ``path/to/file.py:attribute`` references on first use (see
    :mod:`flowgrpo.plugins`). Every name has an origin: ``built-in``, ``entry point ...``,
    ``file ...``, ``module ...`` or ``python (<module>)``.

    Args:
        kind: what the registry holds, used in error messages ("sampler", "loss", ...).
        adapt: turns a plugged-in object (reference or entry point) into what the registry holds
            (the reward registry wraps plain scoring functions); identity by default.
    """

    def __init__(self, kind: str, adapt: Callable[[Any], T] | None = None) -> None:
        self.kind = kind
        self.adapt = adapt
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._entry_points: dict[str, tuple[Any, str]] | None = None  # read on first use

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; registering a name twice is an error."""

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            self._origins[name] = origin_of(obj)
            return obj

        return decorator

    def add(self, obj: Any, name: str | None = None) -> str:
        """Register ``obj`` from Python code (adapted like a plug-in) and return its name:
        ``name``, else ``<module>:<qualified name>``. Adding again under the same name replaces
        an earlier :meth:`add` (a redefined function in a notebook), never a built-in."""
        if name is None:
            qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
            name = f"{getattr(obj, '__module__', None) or 'python'}:{qualname}"
            if "<" in qualname:  # a lambda or a local function: not importable by name
                name = f"{name}@{id(obj):x}"
        if self._origins.get(name) == BUILTIN:
            raise ValueError(f"{self.kind} {name!r} is built in and cannot be replaced")
        self._store(name, obj, origin_of(obj))
        return name

    def get(self, name: str) -> T:
        """Return the factory registered as ``name``, importing an entry point or a reference
        on first use.

        Raises:
            UnknownNameError: an unknown name (the message lists the valid names).
            flowgrpo.plugins.PluginError: a reference or entry point that cannot be imported.
        """
        if name in self._items and not self._origins.get(name, "").startswith("file "):
            return self._items[name]
        if is_reference(name):  # a file reference is looked at again: a changed file is re-read
            from .plugins import load_reference

            return self._store(name, *load_reference(name, self.kind))
        pending = self._pending()
        if isinstance(name, str) and name in pending:
            from .plugins import load_entry_point

            entry, origin = pending[name]
            return self._store(name, load_entry_point(entry, self.kind), origin)
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())} (or a "
            "module:attribute or path/to/file.py:attribute reference)"
        )

    def _store(self, name: str, obj: Any, origin: str) -> T:
        """Keep a plugged-in ``obj`` (adapted) under ``name`` with its origin; returns it."""
        self._items[name] = self.adapt(obj) if self.adapt else obj
        self._origins[name] = origin
        return self._items[name]

    def names(self) -> list[str]:
        """Registered names, sorted: the built-ins, Python registrations and entry points (not
        yet imported); references resolved so far are in :meth:`origins`, not here."""
        return sorted({n for n in self._items if not is_reference(n)} | set(self._pending()))

    def origin(self, name: str) -> str:
        """Where ``name`` comes from (``built-in``, ``entry point <dist> <version> (<value>)``,
        ``file <path>``, ``module <name>`` or ``python (<module>)``)."""
        if name in self._origins:
            return self._origins[name]
        pending = self._pending()
        if name in pending:
            return pending[name][1]
        self.get(name)  # an unknown name or a reference: raises, or resolves it
        return self._origins[name]

    def origins(self) -> dict[str, str]:
        """``{name: origin}`` of every name and every reference resolved so far, sorted."""
        return {name: self.origin(name) for name in sorted({*self.names(), *self._items})}

    def rescan(self) -> None:
        """Read the installed entry points again (a distribution installed since)."""
        from .plugins import rescan

        rescan()
        self._entry_points = None

    def _pending(self) -> dict[str, tuple[Any, str]]:
        """Entry points of this kind not shadowed by a name registered in code."""
        if self._entry_points is None:
            from .plugins import entry_points

            self._entry_points = {}
            for name, entry, origin in entry_points(self.kind):
                if name in self._items and self._origins.get(name, "").startswith("entry point"):
                    continue
                if name in self._items:
                    warnings.warn(f"{origin} registers {self.kind} {name!r}, which is already "
                                  f"{self._origins.get(name, 'registered')}; the entry point is "
                                  "ignored", stacklevel=3)
                    continue
                self._entry_points[name] = (entry, origin)
        return {k: v for k, v in self._entry_points.items() if k not in self._items}

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._pending()

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
