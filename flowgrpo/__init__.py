"""flowgrpo: online GRPO-family reinforcement learning for flow-matching generators.

Importing this package is cheap on purpose (samplers, rewards and pipelines import
``flowgrpo.registry``); the trainer and the CLI live in sub-packages (docs/design.md, "Layers").
The Python API (:mod:`flowgrpo.api`) is reachable from here: ``flowgrpo.load_config``,
``flowgrpo.train``, ``flowgrpo.Run``.
"""

import importlib
import sys
import warnings
from pathlib import Path

__version__ = "0.1.0"

_API = ("Run", "load_config", "train")

_MOVED = {
    "advantage_variants": "rl.advantages.variants", "advantages": "rl.advantages",
    "batch": "rl.batch", "credit": "rl.credit", "ema": "rl.ema", "enhancers": "rl.enhancers",
    "grpo": "rl.replay", "kl": "rl.kl", "likelihood_free": "rl.objectives.likelihood_free",
    "loss_variants": "rl.losses.variants", "losses": "rl.losses", "objectives": "rl.objectives",
    "pruning": "rl.pruning", "rollout": "rl.rollout", "steps": "rl.step_selection",
    "views": "rl.views", "tts_prompts": "data.tts_prompts", "config_io": "config.io",
    "checkpoint": "run.checkpoint", "resume": "run.resume", "tracking": "run.tracking",
    "trainer": "training.trainer", "rewards": "training.reward_runner",
    "evaluate": "training.evaluation", "calls": "training.calls", "model": "training.model_setup",
    "engines": "distributed", "ablate": "cli.ablate", "report": "cli.report",
    "doctor": "cli.doctor", "tools": "cli.inference", "plugins": "cli.catalogue",
}
"""Modules of the flat layout before the sub-packages: ``flowgrpo.<old>`` still imports, as the
module it became (README, "Changelog"), so plug-ins written against the old paths keep working."""


__path__.append(str(Path(__file__).with_name("_compat")))  # the old paths, one file each


def _alias(old: str) -> None:
    """Run by ``flowgrpo/_compat/<old>.py``: hand ``sys.modules[old]`` over to the new module."""
    new = f"{__name__}.{_MOVED[old.rpartition('.')[2]]}"
    warnings.warn(f"{old} moved to {new}", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)


def __getattr__(name: str):
    if name in _API:  # imported on first use, keeping `import flowgrpo` cheap
        from flowgrpo import api

        return getattr(api, name)
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'flowgrpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
