"""KL estimators against the reference policy (registry, config ``train.kl``).

Each estimator reads what it needs from :class:`KLInputs` and returns ``[B]`` float32; the
objective says which inputs it provides (:attr:`flowgrpo.rl.objectives.Objective.kl_estimators`).

================ ================================================== ==============================
name             per sample                                         inputs
================ ================================================== ==============================
``exact``        ``mean_el((mu - mu_ref)^2) / (2 std^2)``: the      per-step transitions (``ratio``)
                 exact KL between the two Gaussian transitions
                 (per token ``sum_y p log(p / p_ref)`` between
                 two categorical ones)
``flow_grpo``    ``mean_el((mu - mu_ref)^2) / (2 g^2)``: Flow-GRPO's per-step transitions
                 code, without ``|dt|`` (``std^2 = g^2 |dt|``), i.e.
                 ``exact * |dt|``
``x_mse``        ``mean_el((mu - mu_ref)^2)`` (Flow-Factory's       per-step transitions
                 "x-based" KL)
``velocity_mse`` ``mean_el((v - v_ref)^2)`` on the forward-noised   likelihood-free objectives
                 draws (DiffusionNFT, AWM, the ELBO paper's
                 "girsanov" term)
``log_ratio``    ``exp(d) - d - 1``, ``d = logp_ref - logp``        log-likelihoods (``elbo``,
                 (Schulman's k3; >= 0)                              ``awm``)
``ratio_k3``     ``(r - 1) - log r``, ``r = exp(logp - logp_ref)``  log-likelihoods
                 (dFlowGRPO's code: k3 with the ratio the other     (``dflow_grpo``)
                 way round; >= 0)
================ ================================================== ==============================

Our ``exact`` KL is Flow-GRPO's divided by ``|dt|``, 4 to 100 times larger per step on a shifted
10-step grid: a ``beta`` ported from a Flow-GRPO recipe means ``flow_grpo``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

import samplers
from flowgrpo.registry import Registry

KL_ESTIMATORS: Registry[Callable[[KLInputs], Tensor]] = Registry("kl estimator")


@dataclass
class KLInputs:
    """What an objective can hand a KL estimator; fields it does not provide stay None.

    Attributes:
        mean, ref_mean: ``[B, ...]`` transition means of the policy (with grad) and reference.
        std: ``[B, 1, ..., 1]`` the transitions' shared std; ``dt``: ``[B]`` or a float, ``s' - s``.
        v, ref_v: ``[B, ...]`` velocities of the policy and reference on the same inputs.
        logp, ref_logp: ``[B]`` log-likelihoods of the policy and reference (for a replayed
            step: of the stored next state under each transition).
        transition, ref_transition: the policy's and the reference's transitions from the same
            state (any kind: :meth:`samplers.Transition.kl` or
            :meth:`samplers.Categorical.kl`).
        weight: optional per-position weight broadcastable to ``mean`` / ``v`` (the condition's
            ``LOGPROB_WEIGHT``: 0 where the model generates nothing); element means become
            ``mean_el(weight * ...)`` like the log-prob's.
    """

    mean: Tensor | None = None
    ref_mean: Tensor | None = None
    std: Tensor | None = None
    dt: Tensor | float | None = None
    v: Tensor | None = None
    ref_v: Tensor | None = None
    logp: Tensor | None = None
    ref_logp: Tensor | None = None
    weight: Tensor | None = None
    transition: object | None = None
    ref_transition: object | None = None


def _mean_el(t: Tensor, weight: Tensor | None = None) -> Tensor:
    if weight is not None:
        t = t.float() * weight.float()
    return t.float().flatten(1).mean(1)


def _need(inputs: KLInputs, *names: str) -> list:
    missing = [n for n in names if getattr(inputs, n) is None]
    if missing:
        raise ValueError(f"this KL estimator needs {', '.join(missing)}, which the objective "
                         f"does not provide; see flowgrpo.rl.kl")
    return [getattr(inputs, n) for n in names]


@KL_ESTIMATORS.register("exact")
def exact_kl(inputs: KLInputs) -> Tensor:
    if inputs.transition is not None and inputs.ref_transition is not None:
        return inputs.transition.kl(inputs.ref_transition, weight=inputs.weight)
    mean, ref_mean, std = _need(inputs, "mean", "ref_mean", "std")
    policy, reference = samplers.Transition(mean, std), samplers.Transition(ref_mean.detach(), std)
    return policy.kl(reference, weight=inputs.weight)


@KL_ESTIMATORS.register("flow_grpo")
def flow_grpo_kl(inputs: KLInputs) -> Tensor:
    (dt,) = _need(inputs, "dt")
    dt = torch.as_tensor(dt, dtype=torch.float32, device=inputs.mean.device).abs()
    return exact_kl(inputs) * dt.reshape(-1)


@KL_ESTIMATORS.register("x_mse")
def x_mse_kl(inputs: KLInputs) -> Tensor:
    mean, ref_mean = _need(inputs, "mean", "ref_mean")
    return _mean_el((mean.float() - ref_mean.detach().float()) ** 2, inputs.weight)


@KL_ESTIMATORS.register("velocity_mse")
def velocity_mse_kl(inputs: KLInputs) -> Tensor:
    v, ref_v = _need(inputs, "v", "ref_v")
    return _mean_el((v.float() - ref_v.detach().float()) ** 2, inputs.weight)


@KL_ESTIMATORS.register("log_ratio")
def log_ratio_kl(inputs: KLInputs) -> Tensor:
    logp, ref_logp = _need(inputs, "logp", "ref_logp")
    d = ref_logp.detach().float() - logp.float()
    return d.exp() - d - 1.0


@KL_ESTIMATORS.register("ratio_k3")
def ratio_k3_kl(inputs: KLInputs) -> Tensor:
    logp, ref_logp = _need(inputs, "logp", "ref_logp")
    log_r = logp.float() - ref_logp.detach().float()
    return log_r.exp() - 1.0 - log_r


def get(name: str) -> Callable[[KLInputs], Tensor]:
    """The KL estimator registered as ``name``."""
    return KL_ESTIMATORS.get(name)
