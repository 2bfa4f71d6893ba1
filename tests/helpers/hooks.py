"""The environment that switches on the start-up hooks of ``helpers/startup`` (its
``sitecustomize`` reads it) in a ``flowgrpo`` subprocess and in the cells it spawns."""

from __future__ import annotations

import os

from helpers import ROOT

STARTUP = ROOT / "tests" / "helpers" / "startup"


def hooked(**variables: str) -> dict[str, str]:
    """This process's environment with ``helpers/startup`` first on ``PYTHONPATH`` and the
    hooks' ``variables`` (``FLOWGRPO_TEST_GATE``, ``FLOWGRPO_TEST_SIGNAL``, ...) set."""
    path = os.pathsep.join(p for p in (str(STARTUP), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **{k: str(v) for k, v in variables.items()}}
