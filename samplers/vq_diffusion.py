"""The reverse step of VQ-Diffusion's mask-and-replace chain (Gu et al., 2022).

VQ-Diffusion corrupts a code ``x0`` in ``0..K-1`` (``K`` codes; the mask is the state ``K``) by a
chain whose one step from timestep ``t - 1`` to ``t`` keeps a code with probability
``a_t + b_t``, replaces it by each other code with probability ``b_t`` and masks it with
probability ``c_t``; a mask stays a mask. ``t`` runs over ``0..T-1``, and the cumulative chain
from the data to ``t`` has the same form with ``abar_t``, ``bbar_t``, ``cbar_t``. The paper's
schedule (section 4.1) moves ``abar_t`` linearly from ``alpha_cum_start`` to ``alpha_cum_end``
and ``cbar_t`` linearly from ``gamma_cum_start`` to ``gamma_cum_end``; then
``a_t = abar_t / abar_{t-1}``, ``1 - c_t = (1 - cbar_t) / (1 - cbar_{t-1})`` and the replacement
mass is shared equally, ``b_t = (1 - a_t - c_t) / K`` (likewise ``bbar_t``).

The model gives ``log p(x0 | x_t)`` over the ``K`` codes. The step from ``x_t`` to ``x_{t-1}``
is the posterior of the chain averaged over that prediction,
``p(x_{t-1} | x_t) = sum_x0 p(x0 | x_t) q(x_{t-1} | x_t, x0)``; with the Markov property,
``q(x_{t-1} | x_t, x0) = q(x_t | x_{t-1}) q(x_{t-1} | x0) / q(x_t | x0)``, so with
``u(x0) = p(x0 | x_t) / q(x_t | x0)`` normalised over ``x0``:

- for a code ``k``: ``(abar_{t-1} u(k) + bbar_{t-1}) q(x_t | x_{t-1} = k)``,
- for the mask: ``cbar_{t-1} q(x_t | x_{t-1} = mask)``,

all times ``Z = sum_x0 p(x0 | x_t) / q(x_t | x0)`` (:func:`log_posterior`); the step at ``t = 0``
draws ``x0`` itself from the prediction. A step's :class:`~samplers.Categorical` is that
distribution normalised, the distribution diffusers' ``VQDiffusionScheduler.step`` draws from (it
draws by Gumbel-argmax of the same logarithms, which a constant per token does not change).

Noise levels: the state at timestep ``t`` is at ``sigma = (t + 1) / T`` and the data at
``sigma = 0``, so a step of the chain is ``sigma -> sigma - 1 / T`` (the family's schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import SAMPLERS, Sigma, VelocityFn
from .discrete import Categorical, TokenSampler, distinct_steps

LOG_ZERO = math.log(1e-30)
"""A zero probability in the chain's log tables: the floor diffusers' one-hot logarithms use."""


@dataclass(frozen=True)
class MaskReplaceSchedule:
    """The log tables of a mask-and-replace chain, float32, indexed by timestep ``0..T-1``.

    Attributes:
        num_classes: ``K + 1``, the codes and the mask (the last state).
        log_a, log_b, log_c: one step ``t - 1 -> t``: keep-bonus, replace (each code), mask.
        log_abar, log_bbar, log_cbar: the cumulative chain from the data to ``t``.
    """

    num_classes: int
    log_a: Tensor
    log_b: Tensor
    log_c: Tensor
    log_abar: Tensor
    log_bbar: Tensor
    log_cbar: Tensor

    @property
    def num_timesteps(self) -> int:
        """``T``, the chain's timesteps."""
        return int(self.log_a.shape[0])

    @property
    def mask_id(self) -> int:
        return self.num_classes - 1

    @classmethod
    def linear(cls, num_classes: int, num_timesteps: int = 100,
               alpha_cum_start: float = 0.99999, alpha_cum_end: float = 0.000009,
               gamma_cum_start: float = 0.000009,
               gamma_cum_end: float = 0.99999) -> MaskReplaceSchedule:
        """The paper's schedule: ``abar`` and ``cbar`` linear in ``t`` between their end points
        (the parameters of diffusers' ``VQDiffusionScheduler`` config), computed in float64 and
        stored as float32 logarithms."""
        if num_timesteps < 2 or num_classes < 2:
            raise ValueError(f"a mask-and-replace chain needs num_timesteps >= 2 and num_classes "
                             f">= 2; got {num_timesteps} and {num_classes}")
        codes = num_classes - 1
        frac = torch.arange(num_timesteps, dtype=torch.float64) / (num_timesteps - 1)
        abar = alpha_cum_start + frac * (alpha_cum_end - alpha_cum_start)
        cbar = gamma_cum_start + frac * (gamma_cum_end - gamma_cum_start)
        abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        cbar_prev = torch.cat([torch.zeros(1, dtype=torch.float64), cbar[:-1]])
        a = abar / abar_prev
        c = 1.0 - (1.0 - cbar) / (1.0 - cbar_prev)
        b = (1.0 - a - c) / codes
        bbar = (1.0 - abar - cbar) / codes
        logs = [t.log().float() for t in (a, b, c, abar, bbar, cbar)]
        return cls(num_classes, *logs)


def _log_row(x_t: Tensor, log_keep: Tensor, log_replace: Tensor, log_mask: Tensor,
             codes: int) -> Tensor:
    """``[B, L, K]`` ``log q(x_t | y)`` for each code ``y`` under one step (or the cumulative
    chain) with log keep-bonus ``a``, replace ``b`` and mask ``c`` (``[B, 1, 1]`` each): ``c`` where
    ``x_t`` is the mask, else ``log(a + b)`` at ``y = x_t`` and ``log b`` elsewhere."""
    ids = torch.arange(codes, device=x_t.device)
    same = ids == x_t.unsqueeze(-1)
    row = torch.where(same, torch.logaddexp(log_keep, log_replace), log_replace)
    return torch.where((x_t == codes).unsqueeze(-1), log_mask, row)


def log_posterior(log_p0: Tensor, x_t: Tensor, t: Tensor | int,
                  schedule: MaskReplaceSchedule) -> Tensor:
    """``[B, L, K + 1]`` ``log p(x_{t-1} | x_t)`` of the chain averaged over the prediction
    ``log_p0`` ``[B, L, K]`` at timesteps ``t >= 1`` (an int or ``[B]``), unnormalised by the
    prediction's own mass as diffusers' ``q_posterior`` leaves it (the module's formula)."""
    codes = schedule.num_classes - 1
    t = torch.as_tensor(t, device=log_p0.device).long().reshape(-1, 1, 1)
    if bool((t < 1).any()) or bool((t >= schedule.num_timesteps).any()):
        raise ValueError(f"the posterior step needs 1 <= t < {schedule.num_timesteps}")

    def table(name: str, at: Tensor) -> Tensor:
        return getattr(schedule, name).to(log_p0.device)[at]

    x_t = x_t.long()
    log_p0 = log_p0.float()
    # q(x_t | x0) over the codes x0, then u = p(x0) / q(x_t | x0) normalised (log Z kept)
    cum = _log_row(x_t, table("log_abar", t), table("log_bbar", t), table("log_cbar", t), codes)
    w = log_p0 - cum
    log_z = torch.logsumexp(w, -1, keepdim=True)
    u = w - log_z
    # q(x_{t-1} | x0) averaged over u, for each code and the mask
    prev = t - 1
    codes_prev = torch.logaddexp(u + table("log_abar", prev), table("log_bbar", prev))
    mask_prev = table("log_cbar", prev).expand(*u.shape[:-1], 1)
    averaged = torch.cat([codes_prev, mask_prev], -1)
    # q(x_t | x_{t-1}) for each code and the mask (a mask moves only to the mask)
    step = _log_row(x_t, table("log_a", t), table("log_b", t), table("log_c", t), codes)
    from_mask = torch.where(x_t == codes, 0.0, LOG_ZERO).unsqueeze(-1)
    return averaged + torch.cat([step, from_mask], -1) + log_z


def step_log_probs(log_p0: Tensor, x_t: Tensor, t: int,
                   schedule: MaskReplaceSchedule) -> Tensor:
    """``[B, L, C]`` the logarithms a step at timestep ``t`` draws from: :func:`log_posterior`
    for ``t >= 1`` (``C = K + 1``), the prediction itself at ``t = 0`` (``C = K``, no mask)."""
    return log_p0.float() if t == 0 else log_posterior(log_p0, x_t, t, schedule)


def gumbel_draw(log_probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``[B, L]`` one draw per token by Gumbel-argmax, with the uniforms drawn ``[B, C, L]`` (the
    classes on dim 1) as diffusers' ``VQDiffusionScheduler.step`` draws them from ``generator``,
    so the same generator gives the pipeline's tokens."""
    shape = (log_probs.shape[0], log_probs.shape[-1], log_probs.shape[1])
    uniform = torch.rand(shape, device=log_probs.device, generator=generator)
    gumbel = -torch.log(-torch.log(uniform + 1e-30) + 1e-30)
    return (log_probs.transpose(1, 2) + gumbel).argmax(1)


@SAMPLERS.register("vq_diffusion")
class VQDiffusion(TokenSampler):
    """The exact reverse step of VQ-Diffusion's mask-and-replace chain (the module's formula),
    stepping one timestep of the chain per step: ``sigma = (t + 1) / T -> t / T``.

    ``bind`` it to a family that exposes its chain as ``mask_replace_schedule`` (a
    :class:`MaskReplaceSchedule`; the ``vq_diffusion`` family reads its scheduler's config). The
    model's logits ``v`` are ``[B, L, K + 1]`` with the codes' ``log p(x0 | x_t)`` first; the
    mask's column is ignored. The step into ``sigma' = 0`` draws the codes from the prediction
    and is not trained.
    """

    name = "vq_diffusion"

    def __init__(self) -> None:
        self.schedule: MaskReplaceSchedule | None = None

    def bind(self, adapter: Any) -> VQDiffusion:
        super().bind(adapter)
        schedule = getattr(adapter, "mask_replace_schedule", None)
        if not isinstance(schedule, MaskReplaceSchedule):
            raise ValueError(f"sampler 'vq_diffusion' needs a model with a mask-and-replace chain "
                             f"(the vq_diffusion family); {type(adapter).__name__} has none: "
                             f"choose ctmc")
        self.schedule = schedule
        return self

    def timestep(self, sigma: float, sigma_next: float) -> int:
        """The chain's timestep ``t`` of the step ``sigma -> sigma_next`` (one timestep apart)."""
        steps = self.schedule.num_timesteps
        t = round(sigma * steps) - 1
        if not 0 <= t < steps or abs(sigma_next * steps - t) > 1e-3:
            raise ValueError(f"a vq_diffusion step moves one timestep of {steps}, sigma (t + 1) / "
                             f"{steps} -> t / {steps}; got {sigma} -> {sigma_next} (use the "
                             f"family's schedule)")
        return t

    def transition(self, v: Tensor, x: Tensor, sigma: Sigma, sigma_next: Sigma,
                   velocity_fn: VelocityFn | None = None) -> Categorical:
        """``[B, L, K + 1]`` per-token categorical of ``x_{t-1}`` given the logits ``v``
        ``[B, L, K + 1]`` at tokens ``x`` ``[B, L]``."""
        if self.schedule is None:
            raise ValueError("the vq_diffusion sampler is not bound to a model: call "
                             "sampler.bind(adapter)")
        states = self.schedule.num_classes
        if v.shape[:-1] != x.shape or v.shape[-1] != states:
            raise ValueError(f"logits {tuple(v.shape)} must be the tokens' shape {tuple(x.shape)} "
                             f"plus the chain's {states} states")
        probs = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for s, s_next, rows in distinct_steps(sigma, sigma_next, x.shape[0]):
            rows = rows.to(v.device)
            t = self.timestep(s, s_next)
            logp = step_log_probs(v[rows, :, :-1], x[rows], t, self.schedule)
            probs[rows, :, :logp.shape[-1]] = torch.softmax(logp, -1)
        return Categorical(probs)
