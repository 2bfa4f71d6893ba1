"""flowgrpo: online GRPO-family reinforcement learning for flow-matching generators.

Importing this package is cheap on purpose (samplers, rewards and pipelines import
``flowgrpo.registry``); the trainer and the CLI live in submodules.
"""

__version__ = "0.1.0"
