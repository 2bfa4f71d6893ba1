"""Per-step policy losses: pure tensor functions chosen once by name.

Every loss has the same signature::

    fn(logp [B], logp_old [B], adv [B], **params) -> (loss scalar, metrics)

``logp`` is the log-density of the stored next latent under the current policy (with gradient),
``logp_old`` the same under the policy that sampled it, ``adv`` the sample's advantage. The loss
is averaged over the B samples, so for every variant, with ``logp == logp_old`` (the ratio is
exactly 1 before the first update), the gradient w.r.t. ``logp_i`` is ``-adv_i / B``: the
REINFORCE gradient of GRPO. Variants differ only in how they treat ratios away from 1. Params
come from config as keyword arguments; an unknown one is a ``TypeError`` naming it.

Every variant returns the same metric keys (detached float32 scalars):

- ``train/clipfrac``: fraction of samples where clipping or gating is active (see each variant);
- ``train/approx_kl``: ``0.5 * mean((logp - logp_old)^2)`` (Schulman's k2 estimator);
- ``train/ratio_mean``, ``train/ratio_min``, ``train/ratio_max``: of ``exp(logp - logp_old)``.

Flow log-probs are means over latent elements (docs/design.md, "Conventions"), so one update
moves the ratio by about 1e-4 to 1e-3, not by the 0.1 to 0.3 of token log-probs: trust-region
widths and gate temperatures are set accordingly (Flow-GRPO clips at 1e-4).

Everything is computed in float32. The KL penalty against the reference (``beta * KL``) and any
per-step loss weight are the objective's business (:mod:`flowgrpo.rl.objectives`), not the loss's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from flowgrpo.registry import Registry

LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]

LOSSES: Registry[LossFn] = Registry("loss")

__all__ = [
    "LOSSES",
    "clip_loss",
    "get",
    "guard_loss",
    "sapo_loss",
    "stable_loss",
    "unclipped_loss",
]


def get(name: str) -> LossFn:
    """Return the policy loss registered as ``name`` (``flowgrpo list`` names them).

    Raises:
        UnknownNameError: naming the valid losses.
    """
    return LOSSES.get(name)


def _prepare(logp: Tensor, logp_old: Tensor, adv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Check shapes; return float32 ``(logp, logp_old.detach(), adv.detach())``, each ``[B]``."""
    if logp.ndim != 1 or logp.numel() == 0:
        raise ValueError(f"logp must be a non-empty 1-D tensor [B], got shape {tuple(logp.shape)}")
    for name, value in (("logp_old", logp_old), ("adv", adv)):
        if value.shape != logp.shape:
            raise ValueError(
                f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(value.shape)}"
            )
    return logp.float(), logp_old.detach().float(), adv.detach().float()


def _check_bounds(clip_low: float, clip_high: float, floor_optional: bool = False) -> None:
    """``floor_optional``: ``clip_low = 1`` is accepted (the lower bound 0, which a ratio never
    reaches: no lower clip)."""
    if floor_optional and clip_low == 1.0:
        pass
    elif not 0.0 <= clip_low < 1.0:
        bound = "[0, 1]" if floor_optional else "[0, 1)"
        raise ValueError(f"clip_low must be in {bound} (Flow-GRPO uses 1e-4), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0 (Flow-GRPO uses 1e-4), got {clip_high}")


def _check_positive(**params: float) -> None:
    """Raise a one-line ``ValueError`` naming the first parameter that is not ``> 0``."""
    for name, value in params.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def _metrics(log_ratio: Tensor, active: Tensor) -> dict[str, Tensor]:
    """The shared metric dict from the raw ``log_ratio [B]`` and the ``active [B]`` bool mask."""
    log_ratio = log_ratio.detach()
    ratio = log_ratio.exp()
    return {
        "train/clipfrac": active.detach().float().mean(),
        "train/approx_kl": 0.5 * (log_ratio * log_ratio).mean(),
        "train/ratio_mean": ratio.mean(),
        "train/ratio_min": ratio.min(),
        "train/ratio_max": ratio.max(),
    }


def _ppo_clip(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic clipped objective per sample.

    Returns:
        ``(loss_per_sample [B], cut [B] bool)`` where ``loss_i = max(-A_i r_i, -A_i clip(r_i))``
        and ``cut`` marks the samples whose gradient the clip removes: ``A > 0`` with
        ``r > 1 + clip_high``, or ``A < 0`` with ``r < 1 - clip_low``.
    """
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_sample = torch.maximum(-adv * ratio, -adv * clipped)
    cut = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    return per_sample, cut


@LOSSES.register("clip")
def clip_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    clip_low: float = 1e-4,
    clip_high: float = 1e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO / GRPO clipped surrogate with asymmetric bounds (Schulman et al. 2017; DAPO's
    clip-higher, Yu et al. 2025).

    ``r = exp(logp - logp_old)``,
    ``loss = mean_i max(-A_i r_i, -A_i clamp(r_i, 1 - clip_low, 1 + clip_high))``.

    ``clip_low = clip_high = 1`` is AWM's ``clip_range: 1`` (scxue/advantage_weighted_matching
    ``config/dgx_awm.py`` and ``scripts/train_sd3_awm.py``, commit be51372): the ratio is clamped
    to ``[0, 2]``, so a negative advantage is never clipped and a positive one only past ratio 2,
    which a mean-reduced flow log-prob does not reach in one epoch (in effect ``unclipped``).

    Args:
        logp, logp_old, adv: ``[B]`` each (see the module docstring).
        clip_low, clip_high: the trust region ``[1 - clip_low, 1 + clip_high]`` of the ratio
            (``clip_low`` in ``[0, 1]``).

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose gradient the clip removes.
    """
    _check_bounds(clip_low, clip_high, floor_optional=True)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    per_sample, cut = _ppo_clip(log_ratio.exp(), adv, clip_low, clip_high)
    return per_sample.mean(), _metrics(log_ratio, cut)


@LOSSES.register("unclipped")
def unclipped_loss(
    logp: Tensor, logp_old: Tensor, adv: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The plain importance-weighted policy gradient: ``loss = -mean_i A_i r_i``, no trust region.

    Its gradient is ``-mean_i sg(r_i) A_i grad logp_i``: the ELBO paper's ``epg`` method
    (jaemoo-choi/rethinking-diffusion-rl ``src/utils/base.py`` ``compute_policy_loss``, commit
    c257000, ``-(sg(ratio) A ELBO)``) and AWM's ``clip_range: 1`` short of ratio 2 (see
    :func:`clip_loss`).

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` is always 0.
    """
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    never = torch.zeros_like(adv, dtype=torch.bool)
    return -(adv * log_ratio.exp()).mean(), _metrics(log_ratio, never)


@LOSSES.register("sapo")
def sapo_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347): a sigmoid gate
    instead of a hard clip.

    ``f_tau(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``loss = -mean_i f_{tau_i}(r_i) A_i`` with
    ``tau_i = tau_pos`` where ``A_i > 0`` and ``tau_neg`` otherwise.

    The gate's slope is ``f'(r) = 4 s (1 - s)`` with ``s = sigmoid(tau (r - 1))``: it equals 1 at
    ``r = 1`` (so the gradient there is GRPO's ``-A/B``) and decays smoothly as the ratio leaves
    1, at a rate set by ``tau``; a larger ``tau_neg`` damps negative-advantage updates faster,
    which the paper found more stable.

    The defaults are the paper's (tuned for token log-probs). Mean-reduced flow log-probs move
    the ratio by ~1e-4 per update, where a gate with ``tau ~ 1`` is flat (no trust region at
    all); for a gate that halves the gradient about where Flow-GRPO's clip cuts it
    (``|r - 1| ~ 1e-4``), use ``tau ~ 1.76e4`` (``4 s (1 - s) = 0.5`` at ``tau |r - 1| = 1.76``).

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose gate slope ``f'(r)`` fell
        below 0.5 (the update is damped by more than half).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    ratio = log_ratio.exp()
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(gate * (4.0 / tau) * adv).mean()
    slope = 4.0 * gate * (1.0 - gate)
    return loss, _metrics(log_ratio, slope < 0.5)


@LOSSES.register("stable")
def stable_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    clip_low: float = 1e-4,
    clip_high: float = 1e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """StableDRL (Zhong et al. 2026, "Stabilizing Reinforcement Learning for Diffusion Language
    Models", arXiv:2603.06743): unconditional clipping plus self-normalization.

    ``rho_i = clamp(r_i, 1 - clip_low, 1 + clip_high)`` and

        loss = - sum_i rho_i A_i / sum_i sg(rho_i)
             = - mean_i(rho_i A_i) / mean_i(sg(rho_i)),

    ``sg`` = stop-gradient, sums over the whole batch passed in.

    - Unconditional clipping: PPO's ``max`` keeps the gradient of a ratio outside the trust
      region when the advantage's sign makes the unclipped term the pessimistic one (``A < 0``
      with a large ratio), so a noisy, outlying ratio estimate still produces a gradient spike.
      Here any ratio outside ``[1 - clip_low, 1 + clip_high]`` has its gradient cut, whatever the
      advantage's sign (``clamp`` passes gradient only inside the range).
    - Self-normalization: dividing by the (clipped, detached) ratio sum instead of by ``B``
      makes the update ``sum_i w_i A_i grad(logp_i)`` with weights ``w_i = rho_i / sum_j rho_j``
      that are non-negative and sum to 1 (the self-normalized importance-sampling estimator),
      so the step stays in the convex hull of the per-sample updates however the ratios
      fluctuate. The denominator is a normalizing constant, hence detached: differentiating it
      would add a term pulling every ratio by the current loss value, not by its advantage.

    At ``r = 1`` every ``rho_i = 1`` and the loss is GRPO's ``-mean(A)``.

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples outside the trust region (their
        gradient is cut).
    """
    _check_bounds(clip_low, clip_high)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    ratio = log_ratio.exp()
    rho = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -(rho * adv).sum() / rho.detach().sum()
    outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return loss, _metrics(log_ratio, outside)


@LOSSES.register("guard")
def guard_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    clip_low: float = 1e-4,
    clip_high: float = 1e-4,
    scale: float | Tensor = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO-Guard ratio normalization (Wang et al. 2025, "GRPO-Guard: Mitigating Implicit
    Over-Optimization in Flow Matching via Regulated Clipping", arXiv:2510.22319), then PPO clip.

    What is implemented, with ``d_i = logp_i - logp_old_i`` and ``m = sg(mean_i d_i)``::

        r~_i = exp(scale * (d_i - m))
        loss = mean_i max(-A_i r~_i, -A_i clamp(r~_i, 1 - clip_low, 1 + clip_high))

    Why: for a Gaussian transition with std ``sigma`` and a stored ``x' = mu_old + sigma eps``,
    ``d = mean_el(eps * delta / sigma) - mean_el(delta^2) / (2 sigma^2)``, ``delta = mu_theta -
    mu_old``. The second term is always <= 0, so ratios drift below 1 as the policy moves and
    positive-advantage samples never reach ``1 + clip_high``: the clip stops restraining the
    updates that over-optimize the reward. The paper adds the analytic bias
    ``b = mean_el(delta^2) / (2 sigma^2)`` back per sample; the loss signature sees log-probs
    only, so here the bias is estimated by the batch mean of ``d`` (``E[d] = -b``), which
    re-centres the ratio distribution on 1. Call it once per denoising step (all B samples at the
    same step), since the bias differs between steps. ``m`` is detached: it shifts the trust
    region, it is not a training signal, and at ``r = 1`` it is 0 so the gradient is
    ``-scale * A / B``.

    ``scale`` (float, or ``[B]`` tensor) multiplies the centred log-ratio. The paper multiplies
    by the transition std ``sigma_t * sqrt(-dt)`` so the ratio's spread no longer depends on the
    step's noise level; pass the sampler's per-sample transition std to reproduce that (and
    widen ``clip_low``/``clip_high`` to match the rescaled units). The paper's second component,
    reweighting each step's loss by ``1 / (-dt)``, is not implemented here: a per-step loss
    weight belongs to the step selection (:meth:`flowgrpo.rl.step_selection.StepSelection.weights`).
    The ratio is not divided by its batch std: at ``r = 1`` that std is 0, and dividing would
    make the first update's gradient arbitrarily large.

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose gradient the clip removes,
        judged on the normalized ratio; the ratio metrics are of the raw ratio.
    """
    _check_bounds(clip_low, clip_high)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    if isinstance(scale, Tensor):
        scale = scale.detach().float()
    normalized = ((log_ratio - log_ratio.detach().mean()) * scale).exp()
    per_sample, cut = _ppo_clip(normalized, adv, clip_low, clip_high)
    return per_sample.mean(), _metrics(log_ratio, cut)


# the gate family, MHPO and Mu-GRPO register themselves here
