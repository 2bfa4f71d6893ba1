"""Plug-ins from outside the package: references in a config and entry points of installed
distributions.

Every registry (rewards, families, samplers, losses, advantages, objectives, step selections,
credits, enhancers, ...) takes, wherever a config names one of its pieces, either a registered
name or a **reference**:

- ``package.module:attribute``: imported like any module (installed, on ``PYTHONPATH``, or in the
  current folder);
- ``path/to/file.py:attribute``: the file is run as a module of its own (a relative path starts at
  the current folder); ``attribute`` may be dotted (``Class.factory``).

A reference resolves to what the registry holds, the same object a built-in registers (a sampler
class, a loss function, a family factory, ...). Rewards are the one kind with a shortcut: a
reference to a plain function is a *scoring function* ``fn(media, prompts, metadata, **params)``
returning one score per sample (see :func:`reward_models.base.as_reward_factory`).

Installed distributions register pieces through **entry points**, one group per registry:
``flowgrpo.rewards``, ``flowgrpo.families``, ``flowgrpo.samplers``, ... (:data:`GROUPS`), each
entry ``name = package.module:attribute``. They are listed without being imported; one is
imported the first time a config uses its name.

A reference that cannot be loaded raises :class:`PluginError`: one line naming the reference,
the file and the import error's message.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from .config import ConfigError
from .registry import BUILTIN

GROUPS = {
    "reward": "rewards",
    "pipeline family": "families",
    "sampler": "samplers",
    "loss": "losses",
    "advantage estimator": "advantages",
    "objective": "objectives",
    "step selection": "step_selections",
    "credit": "credits",
    "condition enhancer": "enhancers",
    "kl estimator": "kl_estimators",
    "pruner": "pruners",
    "mix mode": "mix_modes",
}
"""Registry kind -> entry-point group suffix (the group is ``flowgrpo.<suffix>``)."""

_FILE_MODULES: dict[tuple[str, int], Any] = {}  # (resolved path, mtime_ns) -> module
_ENTRY_POINTS: list | None = None  # every installed entry point, read once per process


class PluginError(ConfigError):
    """A reference or an entry point that cannot be loaded (one line: what, where, why)."""


def entry_point_group(kind: str) -> str:
    """The entry-point group of a registry kind (``reward`` -> ``flowgrpo.rewards``)."""
    return f"flowgrpo.{GROUPS.get(kind, kind.replace(' ', '_') + 's')}"


def registries() -> list[tuple[str, Any]]:
    """``[(title, registry)]`` of every kind of piece, in the order ``flowgrpo list`` shows them
    (importing them is cheap: heavy libraries load inside the factories)."""
    import pipelines
    import reward_models
    import samplers
    from reward_models.mix import MIX_MODES

    from . import advantages, credit, enhancers, kl, losses, objectives, pruning, steps

    return [("pipelines", pipelines.FAMILIES), ("samplers", samplers.SAMPLERS),
            ("objectives", objectives.OBJECTIVES), ("losses", losses.LOSSES),
            ("step selections", steps.STEP_SELECTIONS), ("credits", credit.CREDITS),
            ("enhancers", enhancers.ENHANCERS), ("advantages", advantages.ADVANTAGES),
            ("kl estimators", kl.KL_ESTIMATORS), ("pruners", pruning.PRUNERS),
            ("rewards", reward_models.REWARDS), ("mix modes", MIX_MODES)]


def plugged_in() -> list[tuple[str, str, str]]:
    """``[(title, name, origin)]`` of every piece that is not built in: entry points of
    installed distributions, and the references and Python registrations used so far."""
    return [(title, name, origin) for title, registry in registries()
            for name, origin in registry.origins().items() if origin != BUILTIN]


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


def entry_points(kind: str) -> list[tuple[str, Any, str]]:
    """The entry points registered for a registry kind: ``[(name, entry point, origin)]``, the
    first of each name (a distribution found twice on the path is listed once)."""
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        from importlib.metadata import distributions

        _ENTRY_POINTS = [e for dist in distributions() for e in dist.entry_points
                         if e.group.startswith("flowgrpo.")]
    group = entry_point_group(kind)
    seen: dict[str, tuple[str, Any, str]] = {}
    for entry in _ENTRY_POINTS:
        if entry.group != group or entry.name in seen:
            continue
        dist = getattr(entry, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        seen[entry.name] = (entry.name, entry, f"entry point {label} ({entry.value})")
    return list(seen.values())


def rescan() -> None:
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
