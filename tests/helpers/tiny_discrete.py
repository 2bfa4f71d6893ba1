"""Tiny discrete (token) models built in code: the toy's architecture at its smallest, one per
token path, with random weights."""

from __future__ import annotations

import torch

from pipelines.digits_discrete import LEVELS, DigitTokenModel, DigitTokenPipeline


def tiny_digits_discrete_pipeline(seed: int = 0, path: str = "masked", dim: int = 16,
                                  depth: int = 1) -> DigitTokenPipeline:
    """A random :class:`DigitTokenModel` of width ``dim`` for the token ``path``."""
    torch.manual_seed(seed)
    states = LEVELS + 1 if path == "masked" else LEVELS
    return DigitTokenPipeline(DigitTokenModel(states, dim=dim, depth=depth, heads=2), path)
