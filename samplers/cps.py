"""``cps``: coefficients-preserving sampling (Wang & Yu 2025, "Coefficients-Preserving Sampling
for Reinforcement Learning with Flow Matching").

The next latent keeps the flow's coefficients of data and noise: with ``theta = a * pi / 2``,

    x' = (1 - s') * x0_hat + s' * (cos(theta) * eps_hat + sin(theta) * z),    z ~ N(0, I)

so ``std = s' * sin(theta)`` and ``mean = (1 - s') x0_hat + sqrt(s'^2 - std^2) eps_hat``. When
``x0_hat`` is exact and ``eps_hat ~ N(0, I)`` (point-mass data) every ``x'`` is exactly
``N((1 - s') x0, s'^2)``. It is not a discretization of an SDE: it injects O(1) noise per step.
"""

from __future__ import annotations

import math

from torch import Tensor

from .base import (
    SAMPLERS,
    Sampler,
    Sigma,
    Transition,
    VelocityFn,
    check_min_train_sigma,
    step_inputs,
)


@SAMPLERS.register("cps")
class CoefficientsPreserving(Sampler):
    """Coefficients-preserving step.

    Args:
        noise_level: ``a`` in [0, 1]; the fraction of ``s'`` that is fresh noise is
            ``sin(a * pi / 2)`` (0: the Euler step, 1: all fresh noise). Default 0.7.
        min_train_sigma: steps into ``s' <`` this are not trained by default. The std is
            proportional to ``s'``, so the step into diffusers' last nonzero sigma (``1/1000``
            times the shift) has a std ~100x smaller than the others and its log-prob gradient
            swamps the rest (measured on the digits toy: 3.8 vs <= 0.04 per step).
    """

    name = "cps"

    def __init__(self, noise_level: float = 0.7, min_train_sigma: float = 0.02) -> None:
        if not 0.0 <= noise_level <= 1.0:
            raise ValueError(f"cps noise_level must be in [0, 1], got {noise_level}")
        self.noise_level = float(noise_level)
        self.min_train_sigma = check_min_train_sigma("cps", min_train_sigma)

    @property
    def is_stochastic(self) -> bool:
        return self.noise_level > 0.0

    def transition(
        self,
        v: Tensor,
        x: Tensor,
        sigma: Sigma,
        sigma_next: Sigma,
        velocity_fn: VelocityFn | None = None,
    ) -> Transition:
        """Mean ``(1-s') x0_hat + s' cos(theta) eps_hat`` ``[B, ...]``, std ``s' sin(theta)``."""
        step = step_inputs(v, x, sigma, sigma_next)
        theta = self.noise_level * math.pi / 2.0
        # (1-s') x0_hat + s' eps_hat is exactly the Euler step x + dt v, so
        # mean = euler + s' (cos(theta) - 1) eps_hat, with cos - 1 = -2 sin^2(theta/2) written
        # without cancellation; at a = 0 the correction is exactly 0.
        shrink = -2.0 * math.sin(theta / 2.0) ** 2
        mean = step.euler() + (shrink * step.s_next) * step.eps_hat()
        return Transition(mean, step.s_next * math.sin(theta))
