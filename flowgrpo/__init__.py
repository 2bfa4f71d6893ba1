"""flowgrpo: online GRPO-family reinforcement learning for flow-matching generators.

Importing this package is cheap on purpose (samplers, rewards and pipelines import
``flowgrpo.registry``); the trainer and the CLI live in submodules. The Python API
(:mod:`flowgrpo.api`) is reachable from here: ``flowgrpo.load_config``, ``flowgrpo.train``,
``flowgrpo.Run``.
"""

__version__ = "0.1.0"

_API = ("Run", "load_config", "train")


def __getattr__(name: str):
    if name in _API:  # imported on first use, keeping `import flowgrpo` cheap
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'flowgrpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
