"""Pluggable rewards: ``reward_models.get(name, **params)`` -> callable reward."""

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
from .base import REWARDS, Reward, RewardOutput, get, names, register
from .checks import RewardFault, check_output
from .media import Media

__all__ = [
    "REWARDS", "Media", "Reward", "RewardFault", "RewardOutput", "check_output", "get", "names",
    "register",
]
