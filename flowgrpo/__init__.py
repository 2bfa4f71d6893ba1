"""flowgrpo: online GRPO-family reinforcement learning for flow-matching generators.

Importing this package is cheap on purpose (samplers, rewards and pipelines import
``flowgrpo.registry``); the trainer and the CLI live in sub-packages (docs/design.md, "Layers").
The Python API (:mod:`flowgrpo.api`) is reachable from here: ``flowgrpo.load_config``,
``flowgrpo.train``, ``flowgrpo.Run``.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``flowgrpo.<old name>`` to the module of :data:`_MOVED`, with a
    DeprecationWarning that names the new path."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, leaf = fullname.rpartition(".")
        if package == __name__ and leaf in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = f"{__name__}.{_MOVED[spec.name.rpartition('.')[2]]}"
        warnings.warn(f"{spec.name} moved to {new}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module is the moved one, already executed."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    if name in _API:  # imported on first use, keeping `import flowgrpo` cheap
        from flowgrpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'flowgrpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
