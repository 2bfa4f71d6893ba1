"""The reward interface and its registry.

A reward is a callable ``(media, prompts, metadata) -> RewardOutput`` built by a factory
registered by name (``reward_models.get(name, **params)``). Factories import heavy libraries
inside themselves so that importing ``reward_models`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from flowgrpo.registry import Registry

from .media import Media


@dataclass
class RewardOutput:
    """What a reward returns.

    Attributes:
        scores: ``[B]`` float32, one score per sample (higher is better).
        regions: optional ``[B, h, w]`` region-level scores on an image grid (SpatialFlow-GRPO);
            the trainer maps them onto latent positions.
        components: per-sample ``[B]`` scores of each named part of a mixed reward; the trainer
            logs each as ``reward/<name>`` and can normalize them one by one (GDPO).
        info: extra per-batch values worth logging (floats), keyed without the ``reward/`` prefix.
    """

    scores: torch.Tensor
    regions: torch.Tensor | None = None
    components: dict[str, torch.Tensor] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Reward(Protocol):
    """Any callable with this signature is a reward.

    ``metadata`` is one dict per sample; the trainer always sets ``"group"`` (the prompt group id)
    and copies whatever the prompt set provides (e.g. ``"digit"``, ``"text"``, ``"boxes"``).
    A reward with ``groupwise = True`` sees whole groups at once.
    """

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput: ...


REWARDS: Registry[Callable[..., Reward]] = Registry("reward")
register = REWARDS.register


def get(name: str, **params: Any) -> Reward:
    """Build the reward registered as ``name`` with ``params``."""
    return REWARDS.get(name)(**params)


def names() -> list[str]:
    """Registered reward names."""
    return REWARDS.names()
