"""The GRPO update: replay trained steps with gradients and apply the policy loss.

For a trained step ``k`` of sample ``i``: recompute the velocity at ``(x_k, s_k)`` under the same
guidance, rebuild the sampler's Gaussian transition, take the log-prob of the stored ``x_{k+1}``,
``ratio = exp(logp - logp_old)``, and ``loss = policy(logp, logp_old, A) + beta * KL`` where the KL
is between the policy's and the reference's transitions from the same ``x_k`` (same std).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

import samplers
from pipelines import FlowAdapter

from . import losses
from .model import reference
from .rollout import Trajectory, model_velocity


@dataclass
class StepResult:
    """What one replayed step gives: ``[b]`` log-probs and (when beta > 0) ``[b]`` KL."""

    log_prob: torch.Tensor
    kl: torch.Tensor | None


def replay_step(
    adapter: FlowAdapter,
    sampler: samplers.Sampler,
    traj: Trajectory,
    idx: torch.Tensor,
    j: int,
    guidance: float,
    with_kl: bool = False,
    weight: torch.Tensor | None = None,
    autocast: Callable = nullcontext,
) -> StepResult:
    """Recompute the log-prob of trained step ``traj.trained[j]`` for samples ``idx`` (with grad).

    Args:
        idx: ``[b]`` sample indices into the trajectory.
        j: position in ``traj.trained`` (the step is ``k = traj.trained[j]``).
        weight: optional per-position weights for the log-prob (region rewards), ``[b, ...]``.
    """
    k = traj.trained[j]
    cond = traj.cond.index(idx)
    x = traj.latents[idx, k].float()
    x_next = traj.latents[idx, k + 1].float()
    s, s_next = float(traj.sigmas[k]), float(traj.sigmas[k + 1])
    sigma = traj.sigmas[k].to(x.device).expand(x.shape[0])
    velocity = model_velocity(adapter, cond, guidance, autocast)
    tr = sampler.transition(velocity(x, sigma), x, s, s_next, velocity_fn=velocity)
    log_prob = samplers.gaussian_log_prob(x_next, tr.mean, tr.std, weight=weight)
    kl = None
    if with_kl:
        with torch.no_grad(), reference(adapter):
            ref_velocity = model_velocity(adapter, cond, guidance, autocast)
            ref = sampler.transition(ref_velocity(x, sigma), x, s, s_next, velocity_fn=ref_velocity)
        kl = samplers.gaussian_kl(tr.mean, ref.mean.detach(), tr.std)
    return StepResult(log_prob, kl)


def step_loss(
    result: StepResult,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    loss_name: str,
    loss_params: dict,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy + beta * mean(KL)`` and the loss metrics (``train/kl`` added when computed)."""
    loss, metrics = losses.get(loss_name)(result.log_prob, logp_old, adv, **loss_params)
    if result.kl is not None:
        kl = result.kl.mean()
        metrics["train/kl"] = kl.detach()
        loss = loss + beta * kl
    metrics["train/loss"] = loss.detach()
    return loss, metrics
