"""State spaces: what a trajectory's states are, how they are stored and what randomness a step
draws (docs/design.md, "State spaces").

A flow moves either continuous latents (the Gaussian samplers) or token sequences (the discrete
samplers of :mod:`samplers.discrete`). The rollout, the replay and the evaluation never ask which:
they call the adapter's space, and the sampler declares the space it steps in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class StateSpace:
    """One kind of state.

    Attributes:
        name: ``"continuous"`` or ``"tokens"``.
        random_every_step: True when every step of a rollout is a draw, trained or not (a
            discrete chain has no deterministic step); False when the steps a sample does not
            train are deterministic (the Euler step of the probability-flow ODE).
        deterministic_eval: True when evaluation solves the ODE; False when it samples with the
            run's sampler from fixed per-image seeds (a discrete chain).
    """

    name: str
    random_every_step: bool
    deterministic_eval: bool

    def store(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``x`` as it continues after being stored: latents rounded to the storage ``dtype``
        (and back to float32), tokens unchanged (``long``)."""
        if self.name == "tokens":
            return x.long()
        return x.to(dtype).float()

    def stored(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``x`` in its storage dtype (latents) or as ``long`` (tokens)."""
        return x.long() if self.name == "tokens" else x.to(dtype)

    def noise(self, shape: torch.Size | tuple[int, ...], generator: torch.Generator | None,
              device: torch.device | str) -> Tensor:
        """The standard randomness of one step, float32 of ``shape`` (the state's shape):
        ``N(0, 1)`` for latents, ``U[0, 1)`` for tokens (inverse-CDF draws)."""
        if self.name == "tokens":
            return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)


CONTINUOUS = StateSpace("continuous", random_every_step=False, deterministic_eval=True)
"""Continuous latents: Gaussian transitions, Euler steps where a sample does not train."""

TOKENS = StateSpace("tokens", random_every_step=True, deterministic_eval=False)
"""Token sequences ``[B, L]`` over a vocabulary: per-token categorical transitions."""
