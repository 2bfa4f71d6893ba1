"""Pluggable rewards: ``reward_models.build(name, **params)`` -> callable reward (``get`` is the
same function under its older name)."""

from . import (  # noqa: F401  (registration imports)
    aesthetic,
    clap,
    clip,
    digits,
    editing,
    groupwise,
    jpeg,
    mix,
    ocr,
    pickscore,
    regions,
    remote,
    speech,
)
from .base import REWARDS, Reward, RewardOutput, build, get, names, register
from .checks import RewardFault, check_output
from .media import Media

__all__ = [
    "REWARDS", "Media", "Reward", "RewardFault", "RewardOutput", "build", "check_output", "get",
    "names",
    "register",
]
