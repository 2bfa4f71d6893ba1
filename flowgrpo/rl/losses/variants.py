"""Policy losses beyond PPO's clip: the gate family, MHPO and Mu-GRPO, registered in
:data:`flowgrpo.rl.losses.LOSSES` with the same signature and metrics as every loss (see that
module: at ratio 1 the gradient w.r.t. ``logp_i`` is ``-adv_i / B``; flow log-probs move the
ratio by about 1e-4 per update, so trust regions and temperatures are scaled by 5e-4 from their
token-level values: Flow-GRPO clips at 1e-4 where GRPO clips at 0.2)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from flowgrpo.rl.losses.base import (
    LOSSES,
    _check_bounds,
    _check_positive,
    _metrics,
    _ppo_clip,
    _prepare,
)
from flowgrpo.validation import one_of

# Gate shapes g(z) with g(0) = 0, g'(0) = 1, g' even, decreasing in |z| and bounded g, as
# ``(g, g')``; the gate is f(r) = 1 + g(tau (r - 1)) / tau.


def _g_sigmoid(z: Tensor) -> Tensor:
    return 4.0 * (torch.sigmoid(z) - 0.5)


def _dg_sigmoid(z: Tensor) -> Tensor:
    s = torch.sigmoid(z)
    return 4.0 * s * (1.0 - s)


def _dg_tanh(z: Tensor) -> Tensor:
    return 1.0 - torch.tanh(z).square()


def _dg_arctan(z: Tensor) -> Tensor:
    return 1.0 / (1.0 + z.square())


def _g_erf(z: Tensor) -> Tensor:
    return math.sqrt(math.pi / 2.0) * torch.erf(z / math.sqrt(2.0))


def _dg_erf(z: Tensor) -> Tensor:
    return torch.exp(-0.5 * z.square())


def _g_softsign(z: Tensor) -> Tensor:
    # = z / sqrt(1 + z^2); autograd through that form cancels (1/s - z^2/s^3) and returns slopes
    # of the wrong sign beyond |z| ~ 1e3 in float32, through tanh(asinh z) it stays >= 0.
    return torch.tanh(torch.asinh(z))


def _dg_softsign(z: Tensor) -> Tensor:
    return (1.0 + z.square()).pow(-1.5)


_GATES: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    "arctan": (torch.atan, _dg_arctan),
    "erf": (_g_erf, _dg_erf),
    "sigmoid": (_g_sigmoid, _dg_sigmoid),
    "softsign": (_g_softsign, _dg_softsign),
    "tanh": (torch.tanh, _dg_tanh),
}


@LOSSES.register("gate")
def gate_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    fn: str = "erf",
    tau_pos: float = 2e4,
    tau_neg: float = 2.4e4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO's soft gate generalised to a family of admissible gate functions (Denisov,
    Glazyrina, Kryzhanovskiy & Ischenko 2026, "A Systematic Study of Gate Functions in Soft
    Adaptive Policy Optimization", arXiv:2602.19345, section 4, eqs. 6-8; v1 was titled "Smooth
    Gate Functions for Soft Advantage Policy Optimization"; SAPO: Gao et al. 2025,
    arXiv:2511.20347).

    ``f(r) = 1 + g(tau (r - 1)) / tau``, ``loss = -mean_i f_{tau_i}(r_i) A_i`` with
    ``tau_i = tau_pos`` where ``A_i > 0`` and ``tau_neg`` otherwise; the gradient w.r.t.
    ``logp_i`` is ``-A_i f'(r_i) r_i / B`` with the gate slope ``f'(r) = g'(tau (r - 1))``.

    ``fn``        ``g(z)``                       ``g'(z)``               tail of ``g'``  ``sup|g|``
    ``sigmoid``   ``4 (sigmoid(z) - 1/2)``        ``sech^2(z / 2)``       exponential    2
    ``tanh``      ``tanh(z)``                    ``sech^2(z)``           exponential    1
    ``arctan``    ``arctan(z)``                  ``1 / (1 + z^2)``       ``z^-2``       pi/2
    ``erf``       ``sqrt(pi/2) erf(z/sqrt 2)``   ``exp(-z^2 / 2)``       Gaussian       sqrt(pi/2)
    ``softsign``  ``z / sqrt(1 + z^2)``          ``(1 + z^2)^(-3/2)``    ``z^-3``       1

    ``sigmoid`` is SAPO's gate (same gradients as ``sapo`` at the same temperatures; the loss
    value differs by the constant ``mean((1 - 2/tau_i) A_i)``). ``erf``, ``arctan`` and
    ``softsign`` are the paper's eqs. 6-8 (its "softsign" is the algebraic ``z / sqrt(1 + z^2)``).
    ``tanh`` is not in the paper: ``tanh(z) = 2 sigmoid(2z) - 1``, so ``tanh`` at ``tau`` is
    ``sigmoid`` at ``2 tau`` (a narrower exponential gate), kept as a named option. Every gate is
    shifted to pass through ``(1, 1)`` (the paper's normalisation), so at ratio 1 the loss is
    GRPO's ``-mean(A)`` and, its slope being 1, the gradient is ``-A/B``.

    Admissible gates (the paper's properties (i)-(iv), plus the ones they imply that this loss
    relies on); tests/unit/test_losses_variants.py checks each gate against each numerically:

    1. ``f`` is continuously differentiable (paper (i));
    2. ``f(1)`` is finite (here exactly 1);
    3. ``f'(1) = 1`` and it is the global maximum of ``f'`` (paper (ii)): at ratio 1 the update
       is the on-policy REINFORCE one;
    4. ``f' > 0``: the gate is increasing, it damps an update but never reverses its sign;
    5. ``f'`` is even around ``r = 1`` and non-increasing in ``|r - 1|`` (unimodal; paper
       (iii)): the further a ratio from 1, the smaller its update;
    6. ``f`` is bounded, ``|f(r) - 1| <= sup|g| / tau``: an outlying ratio cannot blow up the
       loss;
    7. ``f'(r) -> 0`` and ``r f'(r) -> 0`` as ``r -> inf`` (paper (iv): the per-sample gradient
       carries ``r f'(r)``). On ``r in (0, inf)``, ``|r - 1|`` grows without bound only as
       ``r -> inf``; as ``r -> 0`` the slope tends to ``g'(-tau) > 0`` and the gradient
       vanishes through the factor ``r``.

    Flow scale: the paper's best temperatures for token log-probs are ``tau_pos = 10``,
    ``tau_neg = 12``, next to GRPO's clip 0.2. Flow log-probs are means over latent elements and
    one update moves the ratio by ~1e-4 (Flow-GRPO clips at 1e-4), where ``tau ~ 10`` leaves
    every gate flat (no trust region). The defaults are the paper's scaled by
    ``0.2 / 1e-4 = 2000``: ``tau_pos = 2e4``, ``tau_neg = 2.4e4``, so the gate has decayed at
    Flow-GRPO's bound as much as the paper's had at GRPO's. At ``tau = 2e4`` the slope halves at
    ``|r - 1| = z_half / tau``: 3.8e-5 (softsign), 4.4e-5 (tanh), 5.0e-5 (arctan), 5.9e-5 (erf),
    8.8e-5 (sigmoid). ``erf`` is the default: the paper's strongest gate on AIME.

    Raises:
        ValueError: ``fn`` not one of the gates (naming them), or a temperature ``<= 0``.

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose gate slope ``f'(r)`` fell
        below 0.5 (the update is damped by more than half), as for ``sapo``.
    """
    one_of("fn", fn, sorted(_GATES))
    _check_positive(tau_pos=tau_pos, tau_neg=tau_neg)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    g, dg = _GATES[fn]
    # expm1 keeps r - 1 accurate at |r - 1| ~ 1e-4, where exp(.) - 1 loses 3 digits in float32.
    z = tau * torch.expm1(log_ratio)
    loss = -((1.0 + g(z) / tau) * adv).mean()
    return loss, _metrics(log_ratio, dg(z.detach()) < 0.5)


def _hazard(psi: Tensor, k_pos: float, lambda_pos: float, k_neg: float,
            lambda_neg: float) -> Tensor:
    """MHPO's decoupled Weibull cumulative hazards ``H(x) = (x / lambda)^k`` of the positive and
    the negative shift, ``softplus(psi)`` and ``softplus(-psi)``."""
    return ((F.softplus(psi) / lambda_pos).pow(k_pos)
            + (F.softplus(-psi) / lambda_neg).pow(k_neg))


@LOSSES.register("mhpo")
def mhpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    scale: float = 5e-4,
    c: float = 1.5,
    k_pos: float = 1.5,
    lambda_pos: float = 1.0,
    k_neg: float = 2.0,
    lambda_neg: float = 0.8,
) -> tuple[Tensor, dict[str, Tensor]]:
    """MHPO (Wang, Liu, Gu, Sun & Han 2026, "MHPO: Modulated Hazard-aware Policy Optimization for
    Stable Reinforcement Learning", arXiv:2603.16929): a Log-Fidelity Modulator bounds the
    log-ratio, a Decoupled Hazard Penalty damps positive and negative ratio shifts separately.

    The paper, per token with ``l = log r``::

        psi(l)    = c tanh(l / c)                           (LFM: ~ l near 0, bounded by c, C^inf)
        zeta(psi) = (softplus(psi) / lambda_pos)^k_pos      (DHP: Weibull cumulative hazards of
                  + (softplus(-psi) / lambda_neg)^k_neg      the expansion and the contraction)
        loss      = -mean exp(psi - sg[zeta]) A             (sg = stop-gradient)

    with ``c = 1.5``, ``(k_pos, lambda_pos) = (1.5, 1.0)``, ``(k_neg, lambda_neg) = (2.0, 0.8)``
    (the paper's section 4.1 defaults). The hazard is detached: it scales the step size, it must
    not be minimised itself. The paper's own text was not reachable; the formulas and defaults are
    as quoted, consistently, by a verl port (its
    ``examples/grpo_trainer/run_qwen3-4b_gsm8k_3090_mhpo.sh`` and implementation report) and by an
    independent paper digest (``mhpo.md``).

    What is implemented, with the log-ratio in units of ``scale``, ``u = l / scale``::

        psi      = c tanh(u / c)
        zeta~    = zeta(sg[psi]) - zeta(0)
        loss     = -mean_i exp(scale * psi_i - zeta~_i) A_i

    The gradient w.r.t. ``logp_i`` is ``-A_i m_i / B`` with the multiplier
    ``m = exp(scale psi - zeta~) sech^2(u / c)``: the LFM factor decays symmetrically, the hazard
    factor damps contractions (``r < 1``) earlier and harder than expansions. At the defaults
    ``m`` halves at ``u = -0.57`` and ``u = +1.05``, falls below 0.1 at ``-1.28`` / ``+2.14`` and
    below 0.01 at ``-2.35`` / ``+3.79``, and tends to 0 on both sides.

    Deviations from the paper:

    - Normalisation by ``zeta(0)``. ``softplus(0) = ln 2``, so the paper's penalty is not 0 at
      ratio 1: ``zeta(0) = 1.33`` at the defaults and its gradient there is ``0.265 A``, not
      ``A``. Subtracting the constant ``zeta(0)`` multiplies the paper's loss by
      ``e^zeta(0) = 3.77`` (a learning-rate factor; directions are unchanged) and restores GRPO's
      ``-A/B`` at ratio 1 and ``-mean(A)`` as the loss there. The hazard's minimum is at
      ``psi = 0.26``, not 0, so ``m`` exceeds 1 slightly just above ratio 1 (at most 1.04, at
      ``u = 0.17``).
    - Flow scale, ``scale``. At ``scale = 1`` this is the paper's objective (times ``e^zeta(0)``).
      Flow log-probs are means over latent elements and one update moves ``l`` by ~1e-4, where
      ``scale = 1`` leaves ``m = 1``: REINFORCE, no trust region. The modulator and the hazards
      therefore act on ``u = l / scale`` while the importance weight ``exp(scale psi)`` stays the
      (bounded) true ratio: ``scale psi = scale c tanh(l / (scale c)) ~ l``. The default
      ``scale = 5e-4 = 1e-4 / 0.2`` maps GRPO's clip 0.2, the regime the paper's constants were
      tuned against, onto Flow-GRPO's 1e-4 (the factor the ``gate`` temperatures use): ``m``
      halves at ``l = -2.9e-4`` and ``+5.2e-4`` and is below 1% beyond ``-1.2e-3`` / ``+1.9e-3``.

    Raises:
        ValueError: any parameter ``<= 0``.

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose multiplier ``m`` fell below
        0.5 (the update is damped by more than half).
    """
    _check_positive(scale=scale, c=c, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                    lambda_neg=lambda_neg)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    u = log_ratio / scale
    psi = c * torch.tanh(u / c)
    hazard = _hazard(psi.detach(), k_pos, lambda_pos, k_neg, lambda_neg)
    hazard = hazard - _hazard(torch.zeros_like(psi), k_pos, lambda_pos, k_neg, lambda_neg)
    weight = torch.exp(scale * psi - hazard)
    loss = -(weight * adv).mean()
    multiplier = weight.detach() * (1.0 - torch.tanh(u.detach() / c).square())
    return loss, _metrics(log_ratio, multiplier < 0.5)


@LOSSES.register("mu_grpo")
def mu_grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    clip_low: float = 5e-4,
    clip_high: float = 5e-4,
    veto: float | None = 1e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """mu-GRPO (Tian, Xie & Wei 2026, "How Off-Policy Can GRPO Be? mu-GRPO for Efficient LLM
    Reinforcement Learning", arXiv:2605.17570): many optimisation passes per rollout batch (high
    staleness), kept stable by relaxed clipping plus a negative-advantage veto.

    ``r = exp(logp - logp_old)``, ``l = log r``::

        loss_i = max(-A_i r_i, -A_i clamp(r_i, 1 - clip_low, 1 + clip_high))   (relaxed PPO)
        vetoed: A_i < 0 and |l_i| > veto  ->  loss_i kept as a value, its gradient removed

    Relaxed clipping: stale samples, moved by several passes, stay inside a wider trust region
    and keep their gradient instead of being cut. Veto: the paper finds that what destabilises
    stale training is negative-advantage updates once the policy has drifted from the rollout:
    in a negative-advantage response, the updates of the trigger token (whose ratio crossed the
    veto threshold) and of the suffix after it are removed.

    Source and deviations. Only the abstract was reachable; the rule above follows it and
    secondary descriptions of sections 3-4 (trigger = first position where the ratio crosses a
    veto threshold; failure = "prefix-support mismatch", the current policy giving little mass
    to a stale prefix whose continuation is still pushed down). They disagree on the crossing's
    direction, so the trigger here is two-sided, ``|log r| > veto``; on the high side it also
    removes the ``A < 0``, ``r >> 1`` gradient that PPO keeps with an unbounded weight
    ``|A| r``. A flow loss sees one denoising step per sample and no suffix, so the veto removes
    the trigger sample itself; vetoing the later denoising steps of the same trajectory would
    need per-trajectory bookkeeping in the objective (not done).

    A separate loss rather than parameters of ``clip``: its defaults differ from ``clip``'s (the
    relaxed region and the veto are the method, so ``loss: mu_grpo`` alone selects it and names
    it in the run's config), its ``clipfrac`` also counts vetoed samples, and ``clip`` keeps its
    signature and behaviour untouched. The shared PPO term is the same helper, so
    ``mu_grpo(clip_low=a, clip_high=b, veto=None)`` equals ``clip(clip_low=a, clip_high=b)`` bit
    for bit.

    Flow scale: the paper's bound values were not available. Flow-GRPO clips at 1e-4, where
    GRPO clips at 0.2, and one update moves the ratio by 1e-4 to 1e-3; the defaults relax the
    bounds 5x, ``clip_low = clip_high = 5e-4`` (GRPO's 0.2 scaled by ``1e-4 / 0.2`` is 1e-4; 5e-4
    corresponds to 1.0 on token log-probs, no lower bound at all there), so a few passes' worth
    of drift keeps its gradient, and veto negative-advantage samples as soon as they leave
    Flow-GRPO's own trust region, ``veto = 1e-4``. ``veto=None`` disables the veto.

    Raises:
        ValueError: bounds out of range (see ``clip``) or ``veto <= 0``.

    Returns:
        ``(loss, metrics)``; ``train/clipfrac`` counts samples whose gradient the clip or the veto
        removes.
    """
    _check_bounds(clip_low, clip_high)
    if veto is not None:
        _check_positive(veto=veto)
    logp, logp_old, adv = _prepare(logp, logp_old, adv)
    log_ratio = logp - logp_old
    per_sample, cut = _ppo_clip(log_ratio.exp(), adv, clip_low, clip_high)
    if veto is not None:
        vetoed = (adv < 0) & (log_ratio.detach().abs() > veto)
        per_sample = torch.where(vetoed, per_sample.detach(), per_sample)
        cut = cut | vetoed
    return per_sample.mean(), _metrics(log_ratio, cut)
