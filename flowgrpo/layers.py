"""The layers of the project, bottom to top, declared once (docs/design.md, "Layers").

Plain data, imported by nothing at run time: ``tests/unit/test_import_graph.py`` reads it and
fails on an import circle or on an import against this order, function-level imports included.
"""

from __future__ import annotations

GROUND = ("flowgrpo.errors", "flowgrpo.layers", "flowgrpo.registry", "flowgrpo.seeding",
          "flowgrpo.validation", "flowgrpo.console", "flowgrpo.distributed", "flowgrpo.audio")
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", GROUND),
    ("math", ("samplers",)),  # the state spaces and their steps, which a model family declares
    ("libraries", ("reward_models", "pipelines")),
    ("data", ("flowgrpo.data",)),
    ("rl", ("flowgrpo.rl",)),
    ("config", ("flowgrpo.config",)),
    ("run", ("flowgrpo.run",)),
    ("training", ("flowgrpo.training",)),
    ("commands", ("flowgrpo.cli",)),
    ("python api", ("flowgrpo.api", "flowgrpo.testing")),
    ("package", ("flowgrpo",)),  # the package's __init__ alone: it serves the Python API
    ("old paths", ("flowgrpo._compat",)),  # the flat layout's module names (README, "Changelog")
]
"""Bottom to top. A module imports modules of its own unit (the prefix it matched) or of lower
layers only. Two units of one layer never import each other (rewards and pipelines stay apart),
and the ground imports nothing of the project but ``flowgrpo.errors``."""
