"""Pluggable rewards: ``reward_models.get(name, **params)`` -> callable reward."""

from . import (  # noqa: F401  (registration imports)
    aesthetic,
    clap,
    clip,
    digits,
    groupwise,
    jpeg,
    mix,
    ocr,
    pickscore,
    regions,
    remote,
)
from .base import REWARDS, Reward, RewardOutput, get, names, register
from .media import Media

__all__ = ["REWARDS", "Media", "Reward", "RewardOutput", "get", "names", "register"]
