"""The reward interface and its registry.

A reward is a callable ``(media, prompts, metadata) -> RewardOutput`` built by a factory
registered by name (``reward_models.build(name, **params)``). Factories import heavy libraries
inside themselves so that importing ``reward_models`` stays cheap.

From outside the package a reward is a reference in config (``my_rewards.py:sharpness``), an entry
point (group ``flowgrpo.rewards``) or a callable given to :func:`flowgrpo.api.train`: a plain
function there is a scoring function (:class:`FunctionReward`), a class is a factory.
"""

from __future__ import annotations

import inspect
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

    @classmethod
    def cat(cls, outputs: list[RewardOutput]) -> RewardOutput:
        """The outputs of consecutive chunks of one batch as one, on the CPU in float32; each
        ``info`` value becomes the mean of the chunks' values weighted by their sizes."""
        sizes = torch.tensor([len(o.scores) for o in outputs], dtype=torch.float32)
        scores = torch.cat([o.scores.float().cpu() for o in outputs])
        regions = None
        if outputs[0].regions is not None:
            regions = torch.cat([o.regions.float().cpu() for o in outputs])
        components = None
        if outputs[0].components:
            components = {k: torch.cat([o.components[k].float().cpu() for o in outputs])
                          for k in outputs[0].components}
        info = {}
        for key in outputs[0].info:
            values = torch.tensor([float(o.info[key]) for o in outputs])
            info[key] = float((values * sizes).sum() / sizes.sum())
        return cls(scores, regions, components, info)


class Reward(Protocol):
    """Any callable with this signature is a reward.

    ``metadata`` is one dict per sample; the trainer always sets ``"group"`` (the prompt group id)
    and copies whatever the prompt set provides (e.g. ``"digit"``, ``"text"``, ``"boxes"``).
    A reward with ``groupwise = True`` sees whole groups at once.
    """

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput: ...


class FunctionReward:
    """A plain scoring function as a reward: ``fn(media, prompts, metadata, **params)`` returns
    one score per sample (a list, an array, a ``[B]`` tensor) or a :class:`RewardOutput`.

    A function may set ``fn.groupwise = True`` to see whole prompt groups at once.
    """

    def __init__(self, fn: Callable[..., Any], **params: Any) -> None:
        self.fn, self.params = fn, params
        self.groupwise = bool(getattr(fn, "groupwise", False))

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        out = self.fn(media, prompts, metadata, **self.params)
        if isinstance(out, RewardOutput):
            return out
        if not isinstance(out, torch.Tensor):
            try:
                out = torch.as_tensor(out)
            except (TypeError, ValueError, RuntimeError) as err:
                name = getattr(self.fn, "__name__", "reward")
                raise TypeError(f"{name} returned {type(out).__name__}, not scores (a list of "
                                f"numbers, an array or a tensor): {err}") from None
        return RewardOutput(out.detach().float())


def as_reward_factory(obj: Any) -> Callable[..., Reward]:
    """What a plugged-in reward (a reference, an entry point, a callable given to the Python API)
    becomes in the registry: a class is a factory (``cls(**params)`` is the reward); any other
    callable is a scoring function wrapped in :class:`FunctionReward`, whose params are the
    function's keyword parameters after ``(media, prompts, metadata)``."""
    if isinstance(obj, type):
        return obj
    if not callable(obj):
        raise TypeError(f"a reward must be a scoring function or a reward class, got "
                        f"{type(obj).__name__}")

    def factory(**params: Any) -> Reward:
        return FunctionReward(obj, **params)

    try:  # config checks bind reward.params against the function's own parameters
        parameters = list(inspect.signature(obj).parameters.values())[3:]
        factory.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a builtin without a signature: params go unchecked
        pass
    factory.__name__ = getattr(obj, "__name__", type(obj).__name__)
    return factory


REWARDS: Registry[Callable[..., Reward]] = Registry("reward", adapt=as_reward_factory)
register = REWARDS.register


def build(name: str, **params: Any) -> Reward:
    """Build the reward registered as ``name`` with ``params`` (checked against its signature:
    an unknown one is a :class:`~flowgrpo.registry.ParameterError` naming the valid ones)."""
    return REWARDS.build(name, **params)


get = build
"""The name code written before :func:`build` uses; it builds too."""


def names() -> list[str]:
    """Registered reward names."""
    return REWARDS.names()
