"""The value checks every piece's constructor shares, so each says the same thing the same way.

A count must be an ``int`` that is not a ``bool``: YAML reads ``true`` as a ``bool``, which
Python counts as the integer 1, and a config that says ``draws: true`` is a mistake, not one draw.
Messages are one line, ``<name> must be ..., got <value>``; the caller's ``name`` carries its
prefix (``"window size"``, ``"dppo level"``). The parameter checker (unknown keyword arguments,
with the closest valid one) is :func:`flowgrpo.registry.check_params`, beside the registries it
serves. The ground imports nothing of the project, so every layer may use this module.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def is_integer(value: object) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number (``int``, ``float``, ...) and not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(name: str, value: Any, low: int) -> int:
    """``value`` when it is an integer ``>= low``, else a one-line ``ValueError``:
    ``<name> must be an integer >= <low>, got <value>``."""
    if not is_integer(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def one_of(name: str, value: T, choices: Iterable[Any]) -> T:
    """``value`` when it is one of ``choices``, else a one-line ``ValueError``:
    ``<name> must be one of a, b, c, got <value>``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value
