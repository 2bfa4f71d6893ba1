"""What the ``flowgrpo`` command shows: ``--quiet`` / default / ``--verbose``."""

from __future__ import annotations

QUIET, NORMAL, VERBOSE = -1, 0, 1
_level = NORMAL


def configure(level: int = NORMAL) -> None:
    """Set the console level for this process (``QUIET``, ``NORMAL`` or ``VERBOSE``)."""
    global _level
    _level = level


def level() -> int:
    """The current console level."""
    return _level
