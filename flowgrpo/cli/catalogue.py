"""Plug-ins from outside the package: references in a config and entry points of installed
distributions.

Every registry (the kinds of :data:`flowgrpo.registry.KINDS` with an entry-point group) takes,
wherever a config names one of its pieces, either a registered name or a **reference**:

- ``package.module:attribute``: imported like any module (installed, on ``PYTHONPATH``, or in the
  current folder);
- ``path/to/file.py:attribute``: the file is run as a module of its own (a relative path starts at
  the current folder); ``attribute`` may be dotted (``Class.factory``).

A reference resolves to what the registry holds, the same object a built-in registers (a sampler
class, a loss function, a family factory, ...). Rewards are the one kind with a shortcut: a
reference to a plain function is a *scoring function* ``fn(media, prompts, metadata, **params)``
returning one score per sample (see :func:`reward_models.base.as_reward_factory`).

Installed distributions register pieces through **entry points**, one group per registry (the
``group`` of its kind in :data:`flowgrpo.registry.KINDS`: ``flowgrpo.rewards``,
``flowgrpo.families``, ...), each entry ``name = package.module:attribute``. They are listed
without being imported; one is imported the first time a config uses its name.

A reference that cannot be loaded raises :class:`PluginError`: one line naming the reference,
the file and the import error's message.
"""

from __future__ import annotations

from typing import Any

from flowgrpo.config.pieces import builtin_names, registry_of
from flowgrpo.registry import BUILTIN, KINDS


def registries() -> list[tuple[str, Any]]:
    """``[(title, registry)]`` of every kind of piece that takes plug-ins, in the order
    ``flowgrpo list`` shows them (importing them is cheap: heavy libraries load inside the
    factories)."""
    return [(kind.title, registry_of(kind.name)) for kind in KINDS if kind.group]


def builtins() -> list[tuple[str, list[str]]]:
    """``[(title, built-in names)]`` of every kind, registries and fixed lists alike, in the
    order of :data:`~flowgrpo.registry.KINDS`: the ``built-in:`` part of ``flowgrpo list``."""
    return [(kind.title, builtin_names(kind.name)) for kind in KINDS]


def plugged_in() -> list[tuple[str, str, str]]:
    """``[(title, name, origin)]`` of every piece that is not built in: entry points of
    installed distributions, and the references and Python registrations used so far."""
    return [(title, name, origin) for title, registry in registries()
            for name, origin in registry.origins().items() if origin != BUILTIN]
