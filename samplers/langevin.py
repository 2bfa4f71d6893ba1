"""``langevin``: an Euler step, then one Langevin correction toward the marginal at ``s'``.

Predictor-corrector sampling (Song et al. 2021, "Score-Based Generative Modeling through SDEs",
Alg. 3-4) with the score recovered from the velocity (LC-GRPO):

    x_e   = x + dt * v                                    (inference-aligned Euler predictor)
    score = -(x_e + (1 - s') * v_e) / s'                  (score of p_{s'} at x_e)
    x'    = x_e + delta * score + sqrt(2 delta) * z,      z ~ N(0, I)

with ``v_e = v`` (``velocity="reuse"``: one model call per step) or ``v_e = v(x_e, s')``
(``velocity="model"``: a second call). The default ``delta`` matches the randomness of the ``sde``
sampler with Flow-GRPO's ``g`` at the same noise level: ``2 delta = g(s)^2 * (-dt)``. The last
step (``s' = 0``, where the score is undefined) is the plain Euler step with std 0.
"""

from __future__ import annotations

import math

import torch
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
from .sde import flow_grpo_g

VELOCITY_MODES = ("reuse", "model")


@SAMPLERS.register("langevin")
class LangevinCorrector(Sampler):
    """Euler predictor plus one Langevin corrector step at ``s'``.

    Args:
        noise_level: ``a`` of Flow-GRPO's ``g(s) = a*sqrt(s/(1-s~))`` that sets the default
            step size ``delta = g(s)^2 * (-dt) / 2`` (same std as ``sde`` at this level).
            Default 0.7.
        delta: a fixed Langevin step size (>= 0) overriding the one derived from
            ``noise_level``; None (default) derives it per step.
        velocity: ``"reuse"`` the step's velocity for the score (default, one model call) or
            ``"model"`` evaluate ``velocity_fn(x_e, s')`` (two calls per step).
        min_train_sigma: steps into ``s' <`` this are not trained by default (step selections
            sample them with Euler). The corrector is a gradient step of size ``delta`` on a
            density of variance about ``s'^2``; it is stable only while ``delta / s'^2`` is well
            below 1. Into diffusers' last nonzero sigma (``1/1000`` times the shift) it is in the
            thousands: on the digits toy, ``delta / s'^2 = 3430`` there, the step wrecks the
            sample and its log-prob gradient is 26x the largest of the others (32.8 vs 1.24).
    """

    name = "langevin"

    def __init__(
        self,
        noise_level: float = 0.7,
        delta: float | None = None,
        velocity: str = "reuse",
        min_train_sigma: float = 0.02,
    ) -> None:
        if not (math.isfinite(noise_level) and noise_level >= 0.0):
            raise ValueError(f"langevin noise_level must be finite and >= 0, got {noise_level}")
        if delta is not None and not (math.isfinite(delta) and delta >= 0.0):
            raise ValueError(f"langevin delta must be finite and >= 0 (or None), got {delta}")
        if velocity not in VELOCITY_MODES:
            raise ValueError(
                f"unknown langevin velocity {velocity!r}; valid: {', '.join(VELOCITY_MODES)}"
            )
        self.noise_level = float(noise_level)
        self.min_train_sigma = check_min_train_sigma("langevin", min_train_sigma)
        self.delta = None if delta is None else float(delta)
        self.velocity = velocity

    @property
    def is_stochastic(self) -> bool:
        return (self.delta if self.delta is not None else self.noise_level) > 0.0

    @property
    def needs_model_call(self) -> bool:
        """True for ``velocity="model"`` (unless the step size is 0: then nothing is corrected)."""
        return self.velocity == "model" and self.is_stochastic

    def transition(
        self,
        v: Tensor,
        x: Tensor,
        sigma: Sigma,
        sigma_next: Sigma,
        velocity_fn: VelocityFn | None = None,
    ) -> Transition:
        """Mean ``x_e + delta * score(x_e, s')`` ``[B, ...]``, std ``sqrt(2 delta)``.

        ``velocity_fn(x_e [B, ...], s' [B])`` is required when :attr:`needs_model_call`; it is
        called once on the whole batch (samples already at ``s' = 0`` are then ignored).
        """
        step = step_inputs(v, x, sigma, sigma_next)
        x_e = step.euler()
        if not self.is_stochastic:
            return Transition(x_e, step.zero_std())
        if self.delta is None:
            delta = 0.5 * flow_grpo_g(self.noise_level, step.s, step.s_next) ** 2 * (-step.dt)
        else:
            delta = torch.full_like(step.s, self.delta)
        corrected = step.s_next > 0.0
        if not bool(corrected.any()):
            return Transition(x_e, step.zero_std())
        v_e = step.v
        if self.needs_model_call:
            if velocity_fn is None:
                raise ValueError(
                    "langevin with velocity='model' needs velocity_fn(x, sigma) to evaluate the "
                    "model at (x_e, s'); pass it, or use velocity='reuse'"
                )
            v_e = velocity_fn(x_e, step.s_next.reshape(-1).contiguous()).to(torch.float32)
        # Where s' = 0 the score is undefined: divide by 1 there and mask the result out.
        s_safe = torch.where(corrected, step.s_next, torch.ones_like(step.s_next))
        score = -(x_e + (1.0 - step.s_next) * v_e) / s_safe
        delta = torch.where(corrected, delta, torch.zeros_like(delta))
        mean = torch.where(corrected, x_e + delta * score, x_e)
        return Transition(mean, torch.sqrt(2.0 * delta))
