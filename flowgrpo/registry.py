"""Name -> factory registries shared by every extension kind (samplers, losses, rewards, ...).

One dialect for every kind: ``registry.get(name)`` looks a name up, ``registry.build(name, *args,
**params)`` checks ``params`` against the target's signature and constructs it. An unknown name
raises :class:`UnknownNameError` listing the valid names, an unknown parameter a
:class:`ParameterError` naming the closest valid one, so a typo in a config fails at load time
with the fix in the message. :data:`KINDS` declares every kind once (its title in ``flowgrpo
list``, its entry-point group, where its registry lives); the plug-in groups, the listing, the
config checks and the help texts read it. Each registry also takes plug-ins from outside the
package (entry points, ``module:attribute`` and ``file.py:attribute`` references; the loaders at
the end of this module).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from flowgrpo.errors import PluginError

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


def python_name(obj: Any) -> str:
    """The name of an object given from Python code: ``<module>:<qualified name>``, a reference
    that imports it again, or, for a lambda or a local function (not importable by name), that
    name with ``@<id>`` appended."""
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    name = f"{getattr(obj, '__module__', None) or 'python'}:{qualname}"
    if "<" in qualname:
        name = f"{name}@{id(obj):x}"
    return name


def origin_of(obj: Any) -> str:
    """``built-in`` for objects defined in flowgrpo's packages, else ``python (<module>)``."""
    module = getattr(obj, "__module__", None) or ""
    if module.partition(".")[0] in BUILTIN_PACKAGES:
        return BUILTIN
    return f"python ({module or 'unknown module'})"


@dataclass(frozen=True)
class Kind:
    """One kind of piece, declared once in :data:`KINDS`.

    Attributes:
        name: what error messages call one piece (``"sampler"``); the :class:`Registry`'s kind.
        title: the row of ``flowgrpo list`` (``"samplers"``).
        group: the entry-point group installed distributions register pieces under
            (``"flowgrpo.samplers"``); ``""`` for a fixed list of names that takes no plug-ins.
        home: ``module:attribute`` of the registry (or the fixed list), in the package whose
            import registers every built-in. Resolved by the layers above (the configuration
            checks, the command line), never here: the ground imports nothing of the project.
    """

    name: str
    title: str
    group: str
    home: str


KINDS: tuple[Kind, ...] = (
    Kind("pipeline family", "pipelines", "flowgrpo.families", "pipelines:FAMILIES"),
    Kind("sampler", "samplers", "flowgrpo.samplers", "samplers:SAMPLERS"),
    Kind("objective", "objectives", "flowgrpo.objectives", "flowgrpo.rl.objectives:OBJECTIVES"),
    Kind("loss", "losses", "flowgrpo.losses", "flowgrpo.rl.losses:LOSSES"),
    Kind("step selection", "step selections", "flowgrpo.step_selections",
         "flowgrpo.rl.step_selection:STEP_SELECTIONS"),
    Kind("window strategy", "window strategies", "", "samplers.window:STRATEGIES"),
    Kind("credit", "credits", "flowgrpo.credits", "flowgrpo.rl.credit:CREDITS"),
    Kind("condition enhancer", "enhancers", "flowgrpo.enhancers",
         "flowgrpo.rl.enhancers:ENHANCERS"),
    Kind("advantage estimator", "advantages", "flowgrpo.advantages",
         "flowgrpo.rl.advantages:ADVANTAGES"),
    Kind("kl estimator", "kl estimators", "flowgrpo.kl_estimators",
         "flowgrpo.rl.kl:KL_ESTIMATORS"),
    Kind("pruner", "pruners", "flowgrpo.pruners", "flowgrpo.rl.pruning:PRUNERS"),
    Kind("reward", "rewards", "flowgrpo.rewards", "reward_models:REWARDS"),
    Kind("mix mode", "mix modes", "flowgrpo.mix_modes", "reward_models.mix:MIX_MODES"),
)
"""Every kind of piece, in the order ``flowgrpo list`` shows them."""


def declaration(name: str) -> Kind:
    """The declaration of kind ``name`` (``"sampler"``); one not in :data:`KINDS` (a registry a
    test or a plug-in makes for itself) gets the title ``<name>s`` and the group
    ``flowgrpo.<name>s``, spaces as underscores."""
    for declared in KINDS:
        if declared.name == name:
            return declared
    plural = name.replace(" ", "_") + "s"
    return Kind(name, name + "s", f"flowgrpo.{plural}", "")


class UnknownNameError(ValueError):
    """Raised when a registry is asked for a name it does not hold."""


class ParameterError(TypeError, ValueError):
    """A parameter a piece does not take, or a required one missing.

    Python raises a ``TypeError`` for an unexpected keyword and the pieces raise ``ValueError``
    for a bad value; this is both, so a caller catching either for "bad parameters" catches it.
    """


class Registry(Generic[T]):
    """A named collection of factories (functions or classes) of one kind.

    Besides the names registered in code, a registry holds the entry points of installed
    distributions (its kind's group in :data:`KINDS`, listed without importing them) and
    resolves ``module:attribute`` / ``path/to/file.py:attribute`` references on first use (the
    loaders at the end of this module). Every name has an origin: ``built-in``, ``entry point
    ...``, ``file ...``, ``module ...`` or ``python (<module>)``.

    Args:
        kind: what the registry holds, used in error messages ("sampler", "loss", ...); its
            title and entry-point group come from its declaration in :data:`KINDS`.
        adapt: turns a plugged-in object (reference or entry point) into what the registry holds
            (the reward registry wraps plain scoring functions); identity by default.
    """

    def __init__(self, kind: str, adapt: Callable[[Any], T] | None = None) -> None:
        declared = declaration(kind)
        self.kind = kind
        self.title = declared.title
        self.group = declared.group
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
            name = python_name(obj)
        if self._origins.get(name) == BUILTIN:
            raise ValueError(f"{self.kind} {name!r} is built in and cannot be replaced")
        self._store(name, obj, origin_of(obj))
        return name

    def get(self, name: str) -> T:
        """Look up the factory registered as ``name`` (nothing is built), importing an entry
        point or a reference on first use.

        Raises:
            UnknownNameError: an unknown name (the message lists the valid names).
            flowgrpo.errors.PluginError: a reference or entry point that cannot be imported.
        """
        if name in self._items and not self._origins.get(name, "").startswith("file "):
            return self._items[name]
        if is_reference(name):  # a file reference is looked at again: a changed file is re-read

            return self._store(name, *load_reference(name, self.kind))
        pending = self._pending()
        if isinstance(name, str) and name in pending:

            entry, origin = pending[name]
            return self._store(name, load_entry_point(entry, self.kind), origin)
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())} (or a "
            "module:attribute or path/to/file.py:attribute reference)"
        )

    def build(self, name: str, *args: Any, **params: Any) -> Any:
        """Construct the piece registered as ``name``: ``factory(*args, **params)``, after
        checking ``params`` against the factory's signature (its first ``len(args)`` parameters
        are the caller's).

        Raises:
            UnknownNameError: an unknown name (the message lists the valid names).
            ParameterError: an unknown parameter (naming the closest valid one) or a missing
                one; the factory's own errors (a bad value) pass through.
        """
        factory = self.get(name)
        check_params(factory, params, skip=len(args), label=f"{self.kind} {name!r}",
                     complete=True)
        return factory(*args, **params)

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

        rescan_entry_points()
        self._entry_points = None

    def _pending(self) -> dict[str, tuple[Any, str]]:
        """Entry points of this kind not shadowed by a name registered in code."""
        if self._entry_points is None:

            self._entry_points = {}
            for name, entry, origin in entry_points(self.kind, self.group):
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

    # Temporary registrations (tests, a plug-in's own checks): the registry is global to the
    # process, so whatever a block adds must not leak into the code that runs after it.

    @contextlib.contextmanager
    def registered(self, name: str, obj: T) -> Iterator[T]:
        """Register ``obj`` as ``name`` for the ``with`` block (it may replace what the name
        holds, a built-in too), then restore the name as it was: its object and origin, or no
        entry at all. Yields ``obj``.

        Example::

            with REWARDS.registered("energy_test", energy):
                train(...)  # "energy_test" resolves here, and nowhere after the block
        """
        missing = object()
        before = self._items.get(name, missing), self._origins.get(name, missing)
        self._items[name] = obj
        self._origins[name] = origin_of(obj)
        try:
            yield obj
        finally:
            for table, value in zip((self._items, self._origins), before):
                if value is missing:
                    table.pop(name, None)
                else:
                    table[name] = value

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Registry[T]]:
        """On leaving the ``with`` block, restore every name and origin the registry held on
        entering it: registrations, :meth:`add` calls and references resolved inside the
        block are dropped, and a name the block removed or replaced comes back. Yields the
        registry."""
        items, origins = dict(self._items), dict(self._origins)
        try:
            yield self
        finally:
            self._items.clear()
            self._items.update(items)
            self._origins.clear()
            self._origins.update(origins)


def suggestion(word: object, valid: Sequence[str], prefix: str = "") -> str:
    """`` (did you mean <prefix><closest>?)`` for the valid name closest to ``word``, else ``""``:
    the hint every unknown-name message of the project ends with."""
    close = difflib.get_close_matches(str(word), list(valid), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def check_params(target: Callable[..., Any], params: Mapping[str, Any] | None, skip: int = 0,
                 supplied: Sequence[str] = (), label: str | None = None,
                 complete: bool = False) -> None:
    """Check, without calling it, that ``target`` takes ``params`` as keyword arguments: the one
    parameter checker of the project (config loading, :meth:`Registry.build`, the advantage
    estimators).

    Args:
        target: a function or class (its ``__init__`` without ``self``).
        params: the keyword arguments from a config (``None``: none).
        skip: leading positional parameters the caller supplies itself (e.g. ``logp``).
        supplied: parameters the caller supplies by name (an estimator's ``progress``): not
            settable, and named as such when given.
        label: how the message names ``target`` (default: its ``__name__``).
        complete: also require every parameter without a default (what building it needs).

    Raises:
        ParameterError: one line naming the unknown (or missing) parameter, the closest valid one
            and every valid one.
    """
    label = label or getattr(target, "__name__", repr(target))
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ParameterError(f"{label}: parameters must be a dict, got {type(params).__name__}")
    accepted = [p for p in list(inspect.signature(target).parameters.values())[skip:]
                if p.name not in supplied]
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    valid = [p.name for p in accepted if p.kind in keyword]
    listed = f"valid parameters: {', '.join(valid)}" if valid else "valid: none"
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted)
    unknown = [name for name in params if name not in valid and (name in supplied
                                                                  or not open_ended)]
    if unknown:
        note = " (supplied by the trainer)" if unknown[0] in supplied else ""
        raise ParameterError(f"{label} got an unknown parameter {unknown[0]!r}{note}"
                             f"{suggestion(unknown[0], valid)}; {listed}")
    missing = [p.name for p in accepted if p.kind in keyword and p.name not in params
               and p.default is inspect.Parameter.empty]
    if complete and missing:
        raise ParameterError(f"{label} is missing parameter {missing[0]!r}; {listed}")


_FILE_MODULES: dict[tuple[str, int], Any] = {}  # (resolved path, mtime_ns) -> module


_ENTRY_POINTS: list | None = None  # every installed entry point, read once per process


def entry_point_group(kind: str) -> str:
    """The entry-point group of a registry kind (``reward`` -> ``flowgrpo.rewards``)."""
    return declaration(kind).group


def load_reference(reference: str, kind: str) -> tuple[Any, str]:
    """Import what ``reference`` names; returns ``(object, origin)``.

    ``origin`` is ``file <absolute path>`` or ``module <name>``.

    Raises:
        PluginError: a malformed reference, a missing file or module, an error while importing
            it (with the file and line where it happened) or a missing attribute.
    """
    target, _, attribute = reference.rpartition(":")
    label = f"{kind} {reference!r}"
    if not target.strip() or not attribute.strip():
        raise PluginError(f"{label} is not a reference: write module:attribute or "
                          "path/to/file.py:attribute")
    if _is_file(target):
        path = Path(target).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        if not path.is_file():
            raise PluginError(f"{label}: file not found: {path}")
        module = _import_file(path.resolve(), label)
        where, origin = str(path.resolve()), f"file {path.resolve()}"
    else:
        module = _import_module(target, label)
        where, origin = f"module {target}", f"module {target}"
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            public = sorted(n for n in vars(module) if not n.startswith("_")
                            and callable(vars(module)[n]))
            shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
            raise PluginError(f"{label}: {where} has no attribute {attribute!r} (callables "
                              f"there: {shown or 'none'})") from None
    return obj, origin


def load_entry_point(entry: Any, kind: str) -> Any:
    """Import an entry point, turning a failure into one :class:`PluginError` line."""
    dist = getattr(getattr(entry, "dist", None), "name", None) or "an installed distribution"
    try:
        return entry.load()
    except Exception as err:
        raise PluginError(f"{kind} {entry.name!r} (entry point {entry.value} of {dist}): "
                          f"import failed: {_describe(err)}") from None


def entry_points(kind: str, group: str | None = None) -> list[tuple[str, Any, str]]:
    """The entry points registered for a registry kind (in ``group``, default the kind's):
    ``[(name, entry point, origin)]``, the first of each name (a distribution found twice on the
    path is listed once)."""
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        from importlib.metadata import distributions

        _ENTRY_POINTS = [e for dist in distributions() for e in dist.entry_points
                         if e.group.startswith("flowgrpo.")]
    group = group or entry_point_group(kind)
    seen: dict[str, tuple[str, Any, str]] = {}
    for entry in _ENTRY_POINTS:
        if entry.group != group or entry.name in seen:
            continue
        dist = getattr(entry, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        seen[entry.name] = (entry.name, entry, f"entry point {label} ({entry.value})")
    return list(seen.values())


def rescan_entry_points() -> None:
    """Read the installed entry points again on next use (every registry)."""
    global _ENTRY_POINTS
    _ENTRY_POINTS = None


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _import_module(name: str, label: str) -> Any:
    """Import module ``name``; the current folder is searched too (last, so it never shadows an
    installed package), as ``python -m`` would, since the ``flowgrpo`` script does not."""
    if not any(Path(p or ".").resolve() == Path.cwd().resolve() for p in sys.path):
        sys.path.append(str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except Exception as err:
        spec = None
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # a missing parent package: the import error says it all
            pass
        where = f" ({spec.origin})" if spec is not None and spec.origin else ""
        raise PluginError(f"{label}: importing module {name}{where} failed: "
                          f"{_describe(err)}") from None


def _import_file(path: Path, label: str) -> Any:
    """Run ``path`` as a module (cached until the file changes). Its folder is on ``sys.path``
    while it runs, so it can import modules next to it."""
    key = (str(path), path.stat().st_mtime_ns)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    digest = hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()
    name = f"flowgrpo_plugin_{_identifier(path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{label}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise PluginError(f"{label}: importing {path} failed: {_describe(err, path)}") from None
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:
            pass
    _FILE_MODULES[key] = module
    return module


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text) or "file"


def _describe(err: BaseException, path: Path | None = None) -> str:
    """``Type: message`` on one line, with ``(line N)`` where the error happened in ``path``."""
    message = " ".join(str(err).split()) or "(no message)"
    line = None
    if isinstance(err, SyntaxError) and err.lineno:
        line = err.lineno
        message = err.msg
    elif path is not None:
        for frame in traceback.extract_tb(err.__traceback__):
            if Path(frame.filename) == path:
                line = frame.lineno
    return f"{type(err).__name__}: {message}" + (f" (line {line})" if line else "")
