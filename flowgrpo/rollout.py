"""Rollouts: sample trajectories with a stochastic sampler and keep what training replays.

A :class:`Trajectory` holds, per sample, the latent before and after every step that was taken,
the sigma grid actually used, which steps were stochastic (and are trained), and the sampling-time
log-probs of those steps. A stored next latent is exactly the one the trajectory continued from
(rounded to the storage dtype first), so recomputing its log-prob before any update gives ratio 1.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

import samplers
from pipelines import Cond, FlowAdapter


@dataclass
class Trajectory:
    """One rollout batch.

    Attributes:
        latents: ``[B, T+1, ...]`` latents before/after each of the T steps taken (storage dtype).
        sigmas: ``[T+1]`` float32 grid of the steps taken; with MixGRPO-Flash the deterministic
            DPM-Solver tail after the window is recorded as one final step to sigma = 0.
        trained: indices ``k`` of the stochastic steps (``sigmas[k] -> sigmas[k+1]``) to train.
        log_probs: ``[B, len(trained)]`` float32 sampling-time log-probs of the trained steps.
        cond: the prompt encodings of the batch.
    """

    latents: torch.Tensor
    sigmas: torch.Tensor
    trained: list[int]
    log_probs: torch.Tensor
    cond: Cond

    @property
    def final(self) -> torch.Tensor:
        return self.latents[:, -1]


def model_velocity(
    adapter: FlowAdapter, cond: Cond, guidance: float, autocast: Callable = nullcontext
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``v(x, sigma[B])`` in float32: the adapter's model call under the run's autocast."""

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        with autocast():
            return adapter.velocity(x, sigma, cond, guidance).float()

    return velocity


def _sigma(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return s.to(device=x.device, dtype=torch.float32).expand(x.shape[0])


@torch.no_grad()
def rollout(
    adapter: FlowAdapter,
    sampler: samplers.Sampler,
    cond: Cond,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    trained: list[int],
    guidance: float,
    generator: torch.Generator | None = None,
    after_window: str = "euler",
    flash_ratio: float = 0.5,
    storage_dtype: torch.dtype = torch.float32,
    autocast: Callable = nullcontext,
) -> Trajectory:
    """Denoise ``noise`` along ``sigmas``; steps in ``trained`` use ``sampler``, others Euler.

    Args:
        noise: ``[B, ...]`` initial latents at ``sigmas[0]``.
        sigmas: ``[N+1]`` descending schedule from the adapter.
        trained: stochastic step indices (sorted); empty gives a deterministic Euler rollout.
        after_window: ``"dpm2"`` re-grids the steps after the last trained step and solves them
            with DPM-Solver++(2M) (MixGRPO-Flash); ``"euler"`` keeps the grid.
    """
    velocity = model_velocity(adapter, cond, guidance, autocast)
    ode = samplers.get("ode")
    trained = sorted(trained)
    flash_at = trained[-1] + 1 if after_window == "dpm2" and trained else None
    x = noise.to(storage_dtype).float()
    states, log_probs, grid = [x.to(storage_dtype)], [], [sigmas[0]]
    for k in range(len(sigmas) - 1):
        if k == flash_at:
            # MixGRPO-Flash: the deterministic tail on a coarser grid; recorded as one step
            tail = samplers.flash_sigmas(sigmas, k, flash_ratio).to(sigmas)
            x = samplers.dpm_solver_2m(velocity, x, tail).to(storage_dtype).float()
            states.append(x.to(storage_dtype))
            grid.append(tail[-1])
            break
        s, s_next = sigmas[k], sigmas[k + 1]
        v = velocity(x, _sigma(s, x))
        if k in trained:
            tr = sampler.transition(v, x, float(s), float(s_next), velocity_fn=velocity)
            x = samplers.sample_next(tr, generator=generator).to(storage_dtype).float()
            log_probs.append(samplers.gaussian_log_prob(x, tr.mean, tr.std))
        else:
            x = ode.transition(v, x, float(s), float(s_next)).mean.to(storage_dtype).float()
        states.append(x.to(storage_dtype))
        grid.append(s_next)
    lp = torch.stack(log_probs, 1) if log_probs else noise.new_zeros(noise.shape[0], 0)
    return Trajectory(torch.stack(states, 1), torch.stack(grid).float(), trained, lp.float(), cond)
