"""Pluggable rewards: ``reward_models.get(name, **params)`` -> callable reward."""

from .base import REWARDS, Reward, RewardOutput, get, names, register
from .media import Media

__all__ = ["REWARDS", "Media", "Reward", "RewardOutput", "get", "names", "register"]
