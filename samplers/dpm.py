"""DPM-Solver++(2M) for flow matching, and the re-gridded tail of MixGRPO-Flash.

Flow matching is the diffusion ``x_s = alpha_s x0 + sigma_s eps`` with ``alpha_s = 1 - s`` and
``sigma_s = s``; with ``lambda_s = log(alpha_s / sigma_s)`` and the data prediction
``x0_hat = x - s v``, DPM-Solver++(2M) (Lu et al. 2022, "DPM-Solver++", Alg. 2) steps
``s_{i-1} -> s_i`` (``h_i = lambda_i - lambda_{i-1}``, ``r_i = h_{i-1} / h_i``) as

    D_i = (1 + 1/(2 r_i)) x0_hat_{i-1} - 1/(2 r_i) x0_hat_{i-2}     (D_i = x0_hat_{i-1} first)
    x_i = (sigma_i / sigma_{i-1}) x_{i-1} + alpha_i (1 - exp(-h_i)) D_i.

The step to ``s = 0`` (``lambda = inf``) returns ``x0_hat``. Every step costs one model call, as
an Euler step does. MixGRPO-Flash (Li et al. 2025) solves the part after the training window this
way on a coarser grid, :func:`flash_sigmas`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def flash_sigmas(sigmas: Tensor, window_end: int, ratio: float) -> Tensor:
    """The schedule after the window, re-gridded to fewer steps.

    Returns ``M + 1`` descending values spaced uniformly in sigma from ``sigmas[window_end]`` to
    exactly 0, ``M = max(floor((N - window_end) * ratio), 1)`` steps, ``N = len(sigmas) - 1``.
    Uniform spacing drops the adapter's shift on the tail; the tail is low-noise, where a
    second-order solver is accurate on coarse grids.

    Args:
        sigmas: ``[N + 1]`` descending schedule, last = 0.
        window_end: index of the first sigma after the window (exclusive end), ``0 <= end < N``.
        ratio: fraction of the remaining steps to keep, > 0 (a small tolerance absorbs float
            error in the product, so ``10 * 0.7`` counts as 7).

    Returns:
        ``[M + 1]`` tensor, same dtype and device as ``sigmas``.
    """
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(f"sigmas must be a 1-D schedule of >= 2 values, got {tuple(sigmas.shape)}")
    n = sigmas.numel() - 1
    if not 0 <= window_end < n:
        raise ValueError(f"window_end must be in [0, {n - 1}] for {n} steps, got {window_end}")
    if not (math.isfinite(ratio) and ratio > 0.0):
        raise ValueError(f"flash ratio must be > 0, got {ratio}")
    m = max(math.floor((n - window_end) * ratio + 1e-9), 1)
    tail = torch.linspace(float(sigmas[window_end]), 0.0, m + 1, dtype=torch.float64)
    tail[0], tail[-1] = float(sigmas[window_end]), 0.0
    return tail.to(dtype=sigmas.dtype, device=sigmas.device)


def _lambda(s: float) -> float:
    """Half log-SNR ``log((1 - s) / s)`` of flow matching; -inf at s = 1, inf at s = 0."""
    if s >= 1.0:
        return -math.inf
    if s <= 0.0:
        return math.inf
    return math.log1p(-s) - math.log(s)


def dpm_solver_2m(
    velocity_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigmas: Tensor
) -> Tensor:
    """Solve the probability-flow ODE deterministically along ``sigmas`` with DPM-Solver++(2M).

    Args:
        velocity_fn: ``(x [B, ...], sigma [B]) -> v`` shaped like ``x``.
        x: ``[B, ...]`` latent at ``sigmas[0]``.
        sigmas: ``[M + 1]`` strictly descending noise levels in [0, 1]; one model call per step.

    Returns:
        ``[B, ...]`` float32 latent at ``sigmas[-1]`` (``x0_hat`` when that is 0).
    """
    levels = [float(s) for s in sigmas.reshape(-1)]
    if len(levels) < 2 or any(b >= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"sigmas must hold >= 2 strictly descending values, got {levels}")
    if levels[0] > 1.0 or levels[-1] < 0.0:
        raise ValueError(f"sigmas must lie in [0, 1], got {levels[0]} .. {levels[-1]}")
    x = x.to(torch.float32)
    batch = x.shape[0]
    x0_prev: Tensor | None = None
    h_prev = math.inf
    for s, s_next in zip(levels, levels[1:]):
        sigma = torch.full((batch,), s, dtype=torch.float32, device=x.device)
        x0 = x - s * velocity_fn(x, sigma).to(torch.float32)
        if s_next == 0.0:
            return x0
        h = _lambda(s_next) - _lambda(s)
        # exp(-h) = alpha_s sigma_s' / (sigma_s alpha_s'): finite (0) even when s = 1.
        exp_neg_h = (1.0 - s) * s_next / (s * (1.0 - s_next))
        if x0_prev is None or not math.isfinite(h_prev):
            d = x0  # first order: no history, or the previous step started at lambda = -inf
        else:
            half_inv_r = h / (2.0 * h_prev)
            d = (1.0 + half_inv_r) * x0 - half_inv_r * x0_prev
        x = (s_next / s) * x + ((1.0 - s_next) * (1.0 - exp_neg_h)) * d
        x0_prev, h_prev = x0, h
    return x
