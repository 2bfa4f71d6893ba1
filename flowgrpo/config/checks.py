"""The two ways a config value is refused, so every message reads ``<key>: invalid value <value>;
<what is allowed>`` (the schema's value checks and the piece checks of :mod:`.pieces`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowgrpo.errors import ConfigError


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and ``allowed`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}: invalid value {value!r}; {allowed}")


def require_choice(key: str, value: Any, choices: Sequence[str], extra: str = "") -> None:
    """Refuse a ``value`` not in ``choices``, listing them (an empty choice shown as ``''
    (off)``) and then ``extra``."""
    shown = ", ".join(c if c else "'' (off)" for c in choices)
    require(value in choices, key, value, f"valid choices: {shown}{extra}")
