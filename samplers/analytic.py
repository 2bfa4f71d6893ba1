"""The analytic test bed: Gaussian data, whose flow is known in closed form (docs/design.md,
"Samplers").

Data ``x0 ~ N(mu, c^2)`` per dimension, ``x_s = (1 - s) x0 + s eps``:

    p_s = N((1 - s) mu, V(s)),    V(s) = (1 - s)^2 c^2 + s^2,
    v(x, s) = (s - (1 - s) c^2) / V(s) * (x - (1 - s) mu) - mu    (exact ``E[eps - x0 | x_s]``),

and the probability-flow ODE is affine: ``x_s = (1 - s) mu + sqrt(V(s)) * x_1`` for the noise
``x_1 ~ N(0, 1)``, so ``x_0 = mu + c x_1``. Tests and benchmarks use it in place of a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Sigma, broadcast_sigma


@dataclass(frozen=True)
class GaussianFlow:
    """Flow of data ``N(mu, c^2)`` per dimension to noise ``N(0, 1)``; ``c = 0``: a point mass."""

    mu: float = 0.5
    c: float = 0.5

    def variance(self, s: Tensor | float) -> Tensor | float:
        """``V(s) = (1 - s)^2 c^2 + s^2``, the marginal variance at ``s``."""
        return (1.0 - s) ** 2 * self.c**2 + s**2

    def marginal(self, s: float) -> tuple[float, float]:
        """``(mean, std)`` of ``p_s``."""
        return (1.0 - s) * self.mu, math.sqrt(self.variance(s))

    def velocity(self, x: Tensor, sigma: Sigma) -> Tensor:
        """Exact velocity ``[B, ...]`` float32 at ``x`` ``[B, ...]``, ``sigma`` float or ``[B]``."""
        x = x.to(torch.float32)
        s = broadcast_sigma(sigma, x)
        return (s - (1.0 - s) * self.c**2) / self.variance(s) * (x - (1.0 - s) * self.mu) - self.mu

    def ode_solution(self, x1: Tensor, s: float) -> Tensor:
        """Where the exact ODE carries noise ``x1`` (at ``s = 1``) by level ``s``; like ``x1``."""
        return (1.0 - s) * self.mu + math.sqrt(self.variance(s)) * x1

    def data_quantiles(
        self, n: int, s: float = 0.0, device: torch.device | str | None = None
    ) -> Tensor:
        """``[n]`` float64 quantiles of ``p_s`` at the probabilities ``(i + 1/2) / n``."""
        mean, std = self.marginal(s)
        p = (torch.arange(n, dtype=torch.float64, device=device) + 0.5) / n
        return mean + std * torch.special.ndtri(p)


def w2_to_marginal(samples: Tensor, flow: GaussianFlow, s: float = 0.0) -> float:
    """1-D 2-Wasserstein distance between ``samples`` ``[n]`` and ``p_s`` (quantile matching).

    In 1-D the optimal coupling is monotone: ``W2^2 = integral (F^-1(u) - G^-1(u))^2 du``,
    estimated by pairing sorted samples with the exact quantiles.
    """
    x = samples.reshape(-1).to(torch.float64).sort().values
    return float(((x - flow.data_quantiles(x.numel(), s, x.device)) ** 2).mean().sqrt())
