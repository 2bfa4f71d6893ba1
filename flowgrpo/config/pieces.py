"""The named pieces a config refers to, checked against their registries at load time.

:data:`SLOTS` says, for each kind of :data:`flowgrpo.registry.KINDS` a config names, which key
names the piece, which key holds its parameters and how they are checked: bound to the target's
signature (a piece the run builds later with arguments of its own: a loss, an objective, a
family) or built now (a cheap one, so a bad value fails before any model loads too).
:func:`validate_pieces` runs them; a bad name or parameter is a :class:`ConfigError` naming the
key. Each kind's registry is found through its declaration (:func:`registry_of`), so no
registry module is named here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from flowgrpo.config.checks import require, require_choice
from flowgrpo.errors import ConfigError
from flowgrpo.registry import (
    BUILTIN,
    Registry,
    UnknownNameError,
    check_params,
    declaration,
    is_reference,
)
from flowgrpo.rl.advantages import SUPPLIED


@dataclass(frozen=True)
class Slot:
    """Where a config names a piece of one kind.

    Attributes:
        key: the config key holding the name (``"train.loss"``).
        kind: the kind, as declared in :data:`flowgrpo.registry.KINDS`.
        params: the key holding its parameters (``""``: it takes none from the config).
        skip: leading positional parameters the run supplies when it calls the piece.
        supplied: parameters the run supplies by name.
        build: build it now with its parameters (cheap pieces), rather than only binding them.
        each: a list key whose entries (``{name, params}``) name pieces instead, when not empty.
        optional: an empty name leaves the piece to its default (nothing to check).
        only_if: a key that must be set (non-zero) for the piece to be built; without it the
            name is still checked.
    """

    key: str
    kind: str
    params: str = ""
    skip: int = 0
    supplied: tuple[str, ...] = ()
    build: bool = False
    each: str = ""
    optional: bool = False
    only_if: str = ""


SLOTS: tuple[Slot, ...] = (
    Slot("model.family", "pipeline family", "model.options", skip=1),
    Slot("sampler.name", "sampler", "sampler.params", build=True),
    Slot("reward.name", "reward", "reward.params", each="reward.components"),
    Slot("reward.mix_mode", "mix mode"),
    Slot("train.loss", "loss", "train.loss_params", skip=3),
    Slot("train.advantage", "advantage estimator", "train.advantage_params", supplied=SUPPLIED),
    Slot("train.objective", "objective", "train.objective_params", skip=1),
    Slot("train.step_selection", "step selection", "train.step_selection_params", build=True),
    Slot("train.credit", "credit", "train.credit_params", build=True),
    Slot("train.enhancer", "condition enhancer", "train.enhancer_params", build=True,
         only_if="train.views"),
    Slot("train.pruner", "pruner", "train.pruner_params", build=True),
    Slot("train.kl", "kl estimator", optional=True),  # '': the objective's default
)
"""Every key that names a piece, in the order they are checked."""


def resolve(kind: str) -> Any:
    """What kind ``kind`` declares as its home: its registry, or a fixed tuple of names. Importing
    it registers the built-ins (heavy libraries load inside the factories, not here)."""
    module, _, attribute = declaration(kind).home.partition(":")
    return getattr(importlib.import_module(module), attribute)


def registry_of(kind: str) -> Registry:
    """The registry of kind ``kind`` (``"sampler"`` -> ``samplers.SAMPLERS``)."""
    registry = resolve(kind)
    assert isinstance(registry, Registry), f"{kind} is a fixed list of names, not a registry"
    return registry


def builtin_names(kind: str) -> list[str]:
    """The built-in names of kind ``kind``: a registry's sorted, a fixed list's in its order."""
    home = resolve(kind)
    if isinstance(home, Registry):
        return [name for name, origin in home.origins().items() if origin == BUILTIN]
    return list(home)


def piece(key: str, name: Any, registry: Registry) -> Any:
    """The piece ``name`` of ``registry`` (a registered name, an entry point or a
    ``module:attribute`` / ``file.py:attribute`` reference); a bad one raises
    :class:`ConfigError` naming ``key``."""
    try:
        return registry.get(name)
    except UnknownNameError:
        require_choice(key, name, registry.names(), " (or a module:attribute or "
                       "path/to/file.py:attribute reference)")
        raise  # not reached: an unknown name is not among the names
    except ConfigError as err:  # a plug-in that cannot be imported (PluginError)
        raise type(err)(f"{key}: {err}") from None


def bind_params(key: str, target: Any, params: dict, skip: int = 0) -> None:
    """Check that ``params`` are keyword arguments ``target`` takes (after its first ``skip``
    positional parameters), without calling it."""
    try:
        check_params(target, params, skip)
    except TypeError as err:
        raise ConfigError(f"{key}: {err}") from None


def _value(config: Any, key: str) -> Any:
    section, _, field = key.partition(".")
    return getattr(getattr(config, section), field)


def _named(config: Any, slot: Slot) -> list[tuple[str, Any, str, dict]]:
    """``[(key, name, params key, params)]`` of the pieces ``slot`` names in ``config``."""
    entries = _value(config, slot.each) if slot.each else []
    if entries:
        return [(f"{slot.each}[{i}].name", entry["name"], f"{slot.each}[{i}].params",
                 entry.get("params") or {}) for i, entry in enumerate(entries)]
    params = _value(config, slot.params) if slot.params else {}
    return [(slot.key, _value(config, slot.key), slot.params, params)]


def check_slot(config: Any, slot: Slot) -> Any:
    """Check the pieces ``slot`` names in ``config`` and their parameters; returns the last one,
    built (``build`` slots) or as registered (``None`` when an optional slot is empty)."""
    registry, found = registry_of(slot.kind), None
    for key, name, params_key, params in _named(config, slot):
        if slot.optional and not name:
            continue
        found = piece(key, name, registry)
        try:
            if slot.build and (not slot.only_if or _value(config, slot.only_if)):
                found = registry.build(name, **params)
            elif params_key and not slot.build:
                # a reference is named by its attribute (``sharpness``), not its whole path
                label = (getattr(found, "__name__", name) if is_reference(name)
                         else f"{slot.kind} {name!r}")
                check_params(found, params, slot.skip, slot.supplied, label)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{params_key}: {err}") from None
    return found


def validate_pieces(config: Any) -> None:
    """Every piece a config names and its parameters (:data:`SLOTS`), then the two checks that
    tie pieces together: a built-in KL estimator suits the objective, and a pruner that drops
    zero-advantage samples has no KL term to bias."""
    built = {slot.key: check_slot(config, slot) for slot in SLOTS}
    tc, kl = config.train, registry_of("kl estimator")
    objective = built["train.objective"]
    plugged = tc.kl and kl.origin(tc.kl) != BUILTIN  # a plug-in declares its own inputs
    require(not tc.kl or plugged or tc.kl in objective.kl_estimators, "train.kl", tc.kl,
            f"objective {tc.objective!r} takes {', '.join(objective.kl_estimators)} (all: "
            f"{', '.join(kl.names())})")
    require(not (tc.beta > 0 and getattr(built["train.pruner"], "drop_zero", False)),
            "train.pruner_params", tc.pruner_params, "drop_zero is only unbiased without a KL "
            "term (beta = 0): set drop_zero: false")
