"""``sde``: Euler-Maruyama on the reverse-time SDE with the flow's marginals (Flow-GRPO, DanceGRPO).

For any diffusion coefficient ``g(s)`` the SDE (Song et al. 2021; Flow-GRPO, Liu et al. 2025, eq. 8)

    dx = [v - g^2/2 * score(x, s)] ds + g dw,    score(x, s) = -eps_hat / s

shares the ODE's marginals. One Euler-Maruyama step from ``s`` to ``s'`` (``dt = s' - s < 0``):

    mean = x + dt * (v + g(s)^2 / (2 s) * eps_hat),    std = g(s) * sqrt(-dt).

Flow-GRPO writes the same mean as ``x*(1 + g^2 dt/(2s)) + v*(1 + g^2 (1-s)/(2s)) dt``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .base import SAMPLERS, Sampler, Sigma, Transition, VelocityFn, step_inputs


def flow_grpo_g(noise_level: float, s: Tensor, s_next: Tensor) -> Tensor:
    """Flow-GRPO's ``g(s) = a * sqrt(s / (1 - s~))``; ``s~ = s`` except ``s~ = s'`` where ``s = 1``.

    At ``s = 1`` the formula is infinite; Flow-GRPO evaluates the denominator at the next
    schedule point instead (its ``sigma_max = sigmas[1]``), which is ``s'`` on the first step.

    Args:
        noise_level: ``a >= 0``.
        s, s_next: ``[B, 1, ..., 1]`` float32 noise levels.

    Returns:
        ``[B, 1, ..., 1]`` float32.
    """
    s_tilde = torch.where(s >= 1.0, s_next, s)
    return noise_level * torch.sqrt(s / (1.0 - s_tilde))


def _flow_grpo(p: dict[str, float], s: Tensor, s_next: Tensor) -> Tensor:
    return flow_grpo_g(p["noise_level"], s, s_next)


def _constant(p: dict[str, float], s: Tensor, s_next: Tensor) -> Tensor:
    return torch.full_like(s, p["eta"])


def _linear(p: dict[str, float], s: Tensor, s_next: Tensor) -> Tensor:
    return p["g_min"] + (p["g_max"] - p["g_min"]) * s


_GFn = Callable[[dict[str, float], Tensor, Tensor], Tensor]

# schedule name -> (g function, its parameters with defaults)
DIFFUSION_SCHEDULES: dict[str, tuple[_GFn, dict[str, float]]] = {
    "flow_grpo": (_flow_grpo, {"noise_level": 0.7}),
    "constant": (_constant, {"eta": 0.3}),
    "linear": (_linear, {"g_min": 0.0, "g_max": 0.7}),
}


@SAMPLERS.register("sde")
class EulerMaruyamaSDE(Sampler):
    """Euler-Maruyama step of the marginal-preserving reverse SDE.

    Args:
        schedule: the diffusion coefficient ``g(s)``:
            ``"flow_grpo"`` ``a * sqrt(s / (1 - s~))`` (param ``noise_level`` = a, default 0.7);
            ``"constant"`` ``eta`` (DanceGRPO, default 0.3);
            ``"linear"`` ``g_min + (g_max - g_min) * s`` (defaults 0.0 and 0.7).
        noise_level, eta, g_min, g_max: the chosen schedule's parameters (all >= 0); leave the
            others unset (None): setting a parameter of another schedule is an error.
    """

    name = "sde"

    def __init__(
        self,
        schedule: str = "flow_grpo",
        noise_level: float | None = None,
        eta: float | None = None,
        g_min: float | None = None,
        g_max: float | None = None,
    ) -> None:
        if schedule not in DIFFUSION_SCHEDULES:
            raise ValueError(
                f"unknown sde schedule {schedule!r}; valid: {', '.join(DIFFUSION_SCHEDULES)}"
            )
        given = {"noise_level": noise_level, "eta": eta, "g_min": g_min, "g_max": g_max}
        self._g, defaults = DIFFUSION_SCHEDULES[schedule]
        stray = [k for k, val in given.items() if val is not None and k not in defaults]
        if stray:
            raise ValueError(
                f"sde schedule {schedule!r} takes {sorted(defaults)}, not {stray}; "
                "choose the schedule that owns them"
            )
        self._params = {k: float(d if given[k] is None else given[k]) for k, d in defaults.items()}
        for k, val in self._params.items():
            if not (math.isfinite(val) and val >= 0.0):
                raise ValueError(f"sde {k} must be finite and >= 0, got {val}")
        self.schedule = schedule
        resolved = {**given, **self._params}
        self.noise_level = resolved["noise_level"]
        self.eta = resolved["eta"]
        self.g_min = resolved["g_min"]
        self.g_max = resolved["g_max"]

    @property
    def is_stochastic(self) -> bool:
        return any(val > 0.0 for val in self._params.values())

    def config(self) -> dict[str, Any]:
        """The schedule and its own parameters (the other schedules' ones are omitted)."""
        return {"schedule": self.schedule, **self._params}

    def g(self, s: Tensor, s_next: Tensor) -> Tensor:
        """Diffusion coefficient ``g(s)`` ``[B, 1, ..., 1]`` for ``[B, 1, ..., 1]`` levels."""
        return self._g(self._params, s, s_next)

    def transition(
        self,
        v: Tensor,
        x: Tensor,
        sigma: Sigma,
        sigma_next: Sigma,
        velocity_fn: VelocityFn | None = None,
    ) -> Transition:
        """Mean ``x + dt*(v + g^2/(2s) * eps_hat)`` ``[B, ...]``, std ``g*sqrt(-dt)``."""
        step = step_inputs(v, x, sigma, sigma_next)
        g = self.g(step.s, step.s_next)
        # Euler mean plus the score correction; at g = 0 this is the Euler step bit for bit.
        mean = step.euler() + (step.dt * g**2 / (2.0 * step.s)) * step.eps_hat()
        return Transition(mean, g * torch.sqrt(-step.dt))
