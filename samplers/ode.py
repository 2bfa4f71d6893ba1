"""``ode``: the deterministic Euler step of the probability-flow ODE ``dx/ds = v``."""

from __future__ import annotations

from torch import Tensor

from .base import SAMPLERS, Sampler, Sigma, Transition, VelocityFn, step_inputs


@SAMPLERS.register("ode")
class EulerODE(Sampler):
    """Euler step ``x' = x + dt * v`` with ``std = 0`` (inference; nothing to train)."""

    name = "ode"

    @property
    def is_stochastic(self) -> bool:
        return False

    def transition(
        self,
        v: Tensor,
        x: Tensor,
        sigma: Sigma,
        sigma_next: Sigma,
        velocity_fn: VelocityFn | None = None,
    ) -> Transition:
        """Mean ``x + dt * v`` ``[B, ...]``, std zeros ``[B, 1, ..., 1]`` (see :class:`Sampler`)."""
        step = step_inputs(v, x, sigma, sigma_next)
        return Transition(step.euler(), step.zero_std())
