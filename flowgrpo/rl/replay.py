"""Replaying a trained step with gradients: the per-step log-prob and its KL.

For trained step ``j`` of sample ``i`` (the step ``k = trained[i, j]``): recompute the velocity at
``(x_k, s_k)`` under the same guidance (and, for a view, that view's condition), rebuild the
sampler's transition (a Gaussian, or a per-token categorical) and take the log-prob of the
stored ``x_{k+1}``. With a reference
(``with_kl``), the KL is between the policy's and the reference's transitions from the same
``x_k`` (same std). The ``ratio`` objective (:mod:`flowgrpo.rl.objectives`) turns these into a loss.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

import samplers
from flowgrpo.rl.kl import KLInputs
from flowgrpo.rl.reference import reference
from flowgrpo.rl.rollout import Trajectory, model_velocity
from pipelines import Cond, FlowAdapter
from pipelines.base import LOGPROB_WEIGHT


@dataclass
class StepResult:
    """What one replayed step gives: log-probs ``[b]`` (``[b, P]`` per region) and, when asked
    for, the KL to the reference ``[b]``."""

    log_prob: torch.Tensor
    kl: torch.Tensor | None


def step_sigmas(traj: Trajectory, k: torch.Tensor) -> tuple[float | torch.Tensor, ...]:
    """``(s, s')`` of steps ``k [b]``: Python floats when every sample is at the same step (the
    rollout's own arithmetic, so replayed log-probs match bit for bit), else ``[b]`` tensors."""
    if bool((k == k[0]).all()):
        first = int(k[0])
        return float(traj.sigmas[first]), float(traj.sigmas[first + 1])
    sigmas = traj.sigmas.to(k.device)
    return sigmas[k], sigmas[k + 1]


def region_log_prob(x_next: torch.Tensor, tr: samplers.Transition,
                    regions: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-region log-probs ``[b, P]``: the Gaussian log-density of ``x_next`` averaged over each
    region's latent positions.

    Args:
        regions: ``[P, ...]`` non-negative membership maps broadcastable to one latent (from the
            adapter's ``position_weights``); each is rescaled to mean 1, so region ``p``'s value
            is the weighted mean of the per-element log-density over that region.
        weight: the condition's :data:`~pipelines.base.LOGPROB_WEIGHT` (``[b, ...]``), applied
            on top of each region's map.
    """
    out = []
    for m in regions:
        w = (m / m.float().mean().clamp_min(1e-12))[None]
        w = w if weight is None else w * weight
        out.append(tr.log_prob(x_next, weight=w))
    return torch.stack(out, 1)


def replay_step(
    adapter: FlowAdapter,
    sampler: samplers.Sampler,
    traj: Trajectory,
    idx: torch.Tensor,
    j: int | tuple[int, ...],
    guidance: float,
    kl: Callable[[KLInputs], torch.Tensor] | None = None,
    regions: torch.Tensor | None = None,
    autocast: Callable = nullcontext,
    cond: Cond | None = None,
) -> StepResult:
    """Recompute the log-prob of each sample's ``j``-th trained step (with grad).

    Args:
        idx: ``[b]`` sample indices into the trajectory.
        j: position along ``traj.trained``'s second axis; sample ``i`` replays step
            ``traj.trained[i, j]``. A tuple of positions replays them all in one model call on
            ``len(j) * b`` rows (step by step: the results are ``[len(j) * b, ...]``, the
            samples of ``j[0]`` first).
        kl: a KL estimator (:mod:`flowgrpo.rl.kl`) against the reference, or None (no reference
            call).
        regions: optional ``[P, ...]`` region maps; then ``log_prob`` is ``[b, P]``.
        cond: the condition to replay under (default: the rollout's, ``traj.cond``); a
            ``[B]``-batch encoding indexed by ``idx`` like the trajectory.
    """
    if isinstance(j, tuple):  # several steps stacked into one call
        k = torch.cat([traj.trained[idx, i] for i in j]).to(traj.latents.device)
        idx = idx.repeat(len(j))
    else:
        k = traj.trained[idx, j].to(traj.latents.device)
    rows = idx.to(traj.latents.device)
    cond = (traj.cond if cond is None else cond).index(idx)
    space, stored = adapter.state_space, traj.latents.dtype
    x = space.store(traj.latents[rows, k], stored)
    x_next = space.store(traj.latents[rows, k + 1], stored)
    s, s_next = step_sigmas(traj, k)
    sigma = traj.sigmas.to(x.device)[k]
    velocity = model_velocity(adapter, cond, guidance, autocast)
    tr = sampler.transition(velocity(x, sigma), x, s, s_next, velocity_fn=velocity)
    weight = cond.tensors.get(LOGPROB_WEIGHT)
    if regions is None:
        log_prob = tr.log_prob(x_next, weight=weight)
    else:
        log_prob = region_log_prob(x_next, tr, regions, weight)
    if kl is None:
        return StepResult(log_prob, None)
    with torch.no_grad(), reference(adapter):
        ref_velocity = model_velocity(adapter, cond, guidance, autocast)
        ref = sampler.transition(ref_velocity(x, sigma), x, s, s_next, velocity_fn=ref_velocity)
    dt = s_next - s
    logp = log_prob if regions is None else tr.log_prob(x_next, weight=weight)
    inputs = KLInputs(mean=getattr(tr, "mean", None), ref_mean=getattr(ref, "mean", None),
                      std=getattr(tr, "std", None), dt=dt, weight=weight, transition=tr,
                      ref_transition=ref, logp=logp,
                      ref_logp=ref.log_prob(x_next, weight=weight))
    return StepResult(log_prob, kl(inputs))
