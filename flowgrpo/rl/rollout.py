"""Rollouts: sample trajectories with a stochastic sampler and keep what training replays.

A :class:`Trajectory` holds, per sample, the latent before and after every step that was taken,
the sigma grid actually used, which steps each sample took stochastically (and are trained), and
the sampling-time log-probs of those steps. A stored next latent is exactly the one the trajectory
continued from (rounded to the storage dtype first), so recomputing its log-prob before any
update gives ratio 1.

Trained steps are per sample, ``[B, J]``: every sample of a batch has ``J`` trained steps, but
not necessarily the same ones (Flash-GRPO gives each prompt group its own step). At a step that
only some samples train, those samples draw the stochastic transition and the others take the
Euler step, all in one model call.

:func:`solve` is the one deterministic completion (Euler or DPM-Solver++(2M)) from any latent
and noise level: the rollout's MixGRPO-Flash tail, TurningPoint-GRPO's completions and eval use
it.

The rollout registry :data:`ROLLOUTS` (``sampler.rollout``) names how a batch is rolled out:
``chain`` (the default, :func:`rollout`: every sample its own trajectory) and ``tree``
(BranchGRPO's tree of shared prefixes, registered by :mod:`flowgrpo.rl.tree`, which
:mod:`flowgrpo.rl.credit` imports). A registered factory takes the
``sampler.rollout_params`` and returns the rollout callable, called as :func:`rollout` is plus
``groups``, the chunk's group ids.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

import samplers
from flowgrpo.registry import Registry
from pipelines import Cond, FlowAdapter
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT

SOLVERS = ("euler", "dpm2")


@dataclass
class Trajectory:
    """One rollout batch.

    Attributes:
        latents: ``[B, T+1, ...]`` states before/after each of the T steps taken: latents in the
            storage dtype, or tokens ``[B, T+1, L]`` (long) of a discrete model.
        sigmas: ``[T+1]`` float32 grid of the steps taken; with MixGRPO-Flash the deterministic
            DPM-Solver tail after the last trained step is recorded as one final step to 0.
        trained: ``[B, J]`` long, the stochastic step indices ``k`` (``sigmas[k] ->
            sigmas[k+1]``) of each sample, ascending along ``J``.
        log_probs: ``[B, J]`` float32 sampling-time log-probs of those steps.
        cond: the prompt encodings of the batch.
    """

    latents: torch.Tensor
    sigmas: torch.Tensor
    trained: torch.Tensor
    log_probs: torch.Tensor
    cond: Cond

    @property
    def final(self) -> torch.Tensor:
        return self.latents[:, -1]

    @property
    def num_trained(self) -> int:
        """``J``, the trained steps per sample."""
        return self.trained.shape[1]


@dataclass
class RolloutSpec:
    """How a rollout samples, shared by every chunk of an epoch.

    Attributes:
        sampler: the stochastic sampler of the trained steps (others are Euler).
        guidance: CFG scale (or guidance-embedding value).
        after_window: solver after the last trained step: ``"euler"`` keeps the grid,
            ``"dpm2"`` re-grids the rest and solves it with DPM-Solver++(2M) (MixGRPO-Flash).
        flash_ratio: fraction of the remaining steps kept by ``"dpm2"``.
        storage_dtype: dtype of the stored latents.
        autocast: zero-argument context factory around every model call.
    """

    sampler: samplers.Sampler
    guidance: float = 1.0
    after_window: str = "euler"
    flash_ratio: float = 0.5
    storage_dtype: torch.dtype = torch.float32
    autocast: Callable = field(default=nullcontext)


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


def integrate(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    sigmas: torch.Tensor,
    method: str = "euler",
) -> torch.Tensor:
    """Deterministic solve of the probability-flow ODE from ``x`` at ``sigmas[0]`` along
    ``sigmas`` (one model call per step); ``[B, ...]`` float32 at ``sigmas[-1]``."""
    if not x.is_floating_point():
        raise ValueError("tokens have no deterministic completion: a discrete model completes "
                         "a trajectory by sampling (credit schemes that solve the ODE, such as "
                         "turning_point, need a continuous model)")
    if method == "dpm2":
        return samplers.dpm_solver_2m(velocity, x, sigmas)
    if method != "euler":
        raise ValueError(f"unknown solver {method!r}; valid: {', '.join(SOLVERS)}")
    ode = samplers.build("ode")
    x = x.float()
    for k in range(len(sigmas) - 1):
        s, s_next = sigmas[k], sigmas[k + 1]
        x = ode.transition(velocity(x, _sigma(s, x)), x, float(s), float(s_next)).mean
    return x


@torch.no_grad()
def solve(
    adapter: FlowAdapter,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    cond: Cond,
    guidance: float,
    method: str = "euler",
    autocast: Callable = nullcontext,
) -> torch.Tensor:
    """Complete ``x`` (at noise level ``sigmas[0]``) deterministically along ``sigmas``.

    Args:
        x: ``[B, ...]`` latents, all at ``sigmas[0]``.
        sigmas: ``[M+1]`` descending noise levels (a suffix of a schedule, or a new grid).
        cond: encodings of the same ``B`` samples.
        method: ``"euler"`` or ``"dpm2"`` (DPM-Solver++(2M)); one model call per step either way.

    Returns:
        ``[B, ...]`` float32 latents at ``sigmas[-1]`` (clean samples when it is 0).
    """
    return integrate(model_velocity(adapter, cond, guidance, autocast), x, sigmas, method)


def step_noise(x: torch.Tensor, stochastic: torch.Tensor,
               generator: torch.Generator | list[torch.Generator] | None,
               space: samplers.StateSpace = samplers.CONTINUOUS,
               lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The standard randomness of one step, shaped like ``x`` (the space's: normal for latents,
    uniform for tokens): from one generator for the whole batch, or from each stochastic
    sample's own generator (zeros for the others).

    With ``lengths`` (the condition's :data:`~pipelines.base.LATENT_LENGTH`, ``[B]``), sample
    ``i``'s noise is drawn at its own length along dim 1 (as in a batch of that length alone)
    and is 0 on its padding."""
    if not isinstance(generator, (list, tuple)):
        noise = space.noise(x.shape, generator, x.device)
        if lengths is not None:
            inside = torch.arange(x.shape[1], device=x.device)[None] < lengths.to(x.device)[:, None]
            noise = noise * inside.reshape(*inside.shape, *([1] * (x.ndim - 2)))
        return noise
    noise = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    for i in stochastic.nonzero().flatten().tolist():
        if lengths is None:
            noise[i] = space.noise(x.shape[1:], generator[i], x.device)
        else:
            n = int(lengths[i])
            noise[i, :n] = space.noise((n, *x.shape[2:]), generator[i], x.device)
    return noise


@torch.no_grad()
def rollout(
    adapter: FlowAdapter,
    spec: RolloutSpec,
    cond: Cond,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    trained: torch.Tensor,
    generator: torch.Generator | list[torch.Generator] | None = None,
    groups: torch.Tensor | None = None,
) -> Trajectory:
    """Denoise ``noise`` along ``sigmas``; each sample's ``trained`` steps use the sampler,
    its other steps Euler.

    Args:
        noise: ``[B, ...]`` initial latents at ``sigmas[0]``.
        sigmas: ``[N+1]`` descending schedule from the adapter.
        trained: ``[B, J]`` stochastic step indices per sample (``J`` may be 0: a deterministic
            Euler rollout).
        generator: the noise of the stochastic steps. One generator: a step draws noise for
            the whole batch whenever any sample is stochastic there. A list, one per sample
            (the trainer's): each sample draws from its own stream at its own stochastic steps
            only, so a sample's trajectory does not depend on its batch-mates (the same on any
            number of processes and any chunking).
        groups: ``[B]`` group ids of the samples; a chain does not read them (every sample is
            its own trajectory), a tree rollout shares prefixes within each group.
    """
    velocity = model_velocity(adapter, cond, spec.guidance, spec.autocast)
    weight = cond.tensors.get(LOGPROB_WEIGHT)  # positions the model does not generate: 0
    lengths = cond.tensors.get(LATENT_LENGTH)  # samples of their own length draw at it
    at_length = {} if lengths is None else {"lengths": lengths}
    ode, dtype = samplers.build("ode"), spec.storage_dtype
    space = adapter.state_space
    trained = trained.to(noise.device).long().sort(dim=1).values
    batch, num = trained.shape
    last = int(trained.max()) if num else -1
    flash_at = last + 1 if spec.after_window == "dpm2" and num else None
    x = space.store(noise, dtype)
    states, grid = [space.stored(x, dtype)], [sigmas[0]]
    log_probs = torch.zeros(batch, num, device=noise.device)
    for k in range(len(sigmas) - 1):
        if k == flash_at:
            # MixGRPO-Flash: the deterministic tail on a coarser grid; recorded as one step
            tail = samplers.flash_sigmas(sigmas, k, spec.flash_ratio).to(sigmas)
            x = integrate(velocity, x, tail, "dpm2").to(dtype).float()
            states.append(x.to(dtype))
            grid.append(tail[-1])
            break
        s, s_next = sigmas[k], sigmas[k + 1]
        v = velocity(x, _sigma(s, x))
        here = trained == k  # [B, J]
        stochastic = here.any(1)
        # a discrete chain draws at every step; latents draw only where a sample trains
        drawn = torch.ones_like(stochastic) if space.random_every_step else stochastic
        if bool(drawn.any()):
            tr = spec.sampler.transition(v, x, float(s), float(s_next), velocity_fn=velocity)
            x_new = tr.sample(noise=step_noise(x, drawn, generator, space, **at_length))
            x_new = space.store(x_new, dtype)
            if bool(stochastic.any()):
                lp = tr.log_prob(x_new, weight=weight)
                log_probs = torch.where(here, lp[:, None], log_probs)
            if not bool(drawn.all()):
                euler = ode.transition(v, x, float(s), float(s_next)).mean.to(dtype).float()
                mask = drawn.reshape(-1, *([1] * (x.ndim - 1)))
                x_new = torch.where(mask, x_new, euler)
            x = x_new
        else:
            x = ode.transition(v, x, float(s), float(s_next)).mean.to(dtype).float()
        states.append(space.stored(x, dtype))
        grid.append(s_next)
    return Trajectory(torch.stack(states, 1), torch.stack(grid).float(), trained,
                      log_probs.float(), cond)


# --------------------------------------------------------------------------- the rollout registry
ROLLOUTS: Registry[Callable[..., Callable[..., Trajectory]]] = Registry("rollout")


@ROLLOUTS.register("chain")
def chain() -> Callable[..., Trajectory]:
    """Every sample its own trajectory from its own initial noise: :func:`rollout`."""
    return rollout


def build(name: str, **params: Any) -> Callable[..., Trajectory]:
    """The rollout registered as ``name`` with its parameters (``sampler.rollout_params``)."""
    return ROLLOUTS.build(name, **params)
