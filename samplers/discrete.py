"""Steps of discrete flows: the per-token categorical transition and the kernels of the mixture
paths (docs/design.md, "Discrete steps").

A discrete flow moves a token sequence ``x_t`` (``[B, L]`` integers over a vocabulary of ``V``)
from the source at ``t = 0`` to the data at ``t = 1`` along a continuous-time Markov chain; the
model gives the posterior ``p_theta(x1 | x_t)`` as logits ``[B, L, V]``. A step from ``t`` to
``t + h`` is a :class:`Categorical` over each token's next value, the discrete counterpart of the
Gaussian :class:`~samplers.base.Transition`: it samples with a given generator, scores a realised
next state and compares itself with another step of its kind.

Three probability paths, each conditional on the clean token ``x1``:

- **masked source** (``mask_id`` given): ``x_t`` is ``x1`` with probability ``kappa(t)``, else the
  mask token;
- **uniform source**: ``x_t`` is ``x1`` with probability ``kappa(t)``, else a uniform token;
- **metric-induced** (FUDOKI): ``p_t(y | x1) = softmax(-beta_t d(x1, .))(y)`` with
  ``beta_t = c (t / (1 - t))^a``, a path that moves through tokens near ``x1`` under the metric
  ``d``.

For the two mixtures the step is an exact categorical in the posterior (:func:`mixture_step`).
For the metric path, :func:`metric_step` sums over every ``x1`` (``O(V^2)`` per token, affordable
for small vocabularies), and :func:`metric_step_log_prob_mc` is dFlowGRPO's Monte-Carlo estimate
from ``n_mc`` posterior draws of the old policy, for vocabularies where the sum is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import SAMPLERS, Sampler, Sigma, VelocityFn
from .spaces import TOKENS

_TINY = 1e-30
PATHS = ("masked", "uniform", "metric")


@dataclass
class Categorical:
    """Independent per-token categoricals of the next token sequence.

    Attributes:
        probs: ``[B, L, V]`` float32, each row a distribution over the vocabulary.
    """

    probs: Tensor

    def sample(self, generator: torch.Generator | None = None,
               noise: Tensor | None = None) -> Tensor:
        """``[B, L]`` long: one draw per token by the inverse CDF of a uniform ``noise``
        ``[B, L]`` in ``[0, 1)`` (drawn from ``generator`` when not given), so a stored noise
        replays the same tokens."""
        probs = self.probs.to(torch.float32)
        if noise is None:
            noise = torch.rand(probs.shape[:-1], generator=generator, device=probs.device)
        cdf = probs.cumsum(-1)
        u = noise.to(torch.float32).unsqueeze(-1) * cdf[..., -1:]
        return (cdf <= u).sum(-1).clamp_max(probs.shape[-1] - 1)

    def token_log_probs(self, x_next: Tensor) -> Tensor:
        """``[B, L]`` log-probability of each realised next token."""
        picked = self.probs.gather(-1, x_next.long().unsqueeze(-1)).squeeze(-1)
        return picked.to(torch.float32).clamp_min(_TINY).log()

    def log_prob(self, x_next: Tensor, weight: Tensor | None = None) -> Tensor:
        """``[B]``: the mean over tokens of the per-token log-probability of ``x_next``, or
        ``mean(weight * lp)`` with a ``[B, L]`` (or broadcastable) token weight, reduced like the
        Gaussian's log-density (a plain mean, so weight 1 gives the unweighted value)."""
        lp = self.token_log_probs(x_next)
        if weight is not None:
            lp = lp * weight.to(torch.float32)
        return lp.mean(1)

    def kl(self, other: Categorical, weight: Tensor | None = None) -> Tensor:
        """``[B]``: the mean over tokens of ``KL(self || other)`` between the two tokens' next
        distributions (exact: a sum over the vocabulary)."""
        p = self.probs.to(torch.float32)
        q = other.probs.to(torch.float32)
        kl = (p * (p.clamp_min(_TINY).log() - q.clamp_min(_TINY).log())).sum(-1)
        if weight is not None:
            kl = kl * weight.to(torch.float32)
        return kl.mean(1)


def posterior(logits: Tensor, x_t: Tensor, mask_id: int | None = None) -> Tensor:
    """``[B, L, V]`` the model's posterior ``p_theta(x1 | x_t)``.

    With a masked source, the mask is never a clean token (its column is removed) and a token
    that is already unmasked is its own posterior (the carry-over of masked diffusion)."""
    probs = torch.softmax(logits.to(torch.float32), -1)
    if mask_id is None:
        return probs
    probs = probs.clone()
    probs[..., mask_id] = 0.0
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(_TINY)
    known = x_t != mask_id
    one_hot = torch.nn.functional.one_hot(x_t.long(), probs.shape[-1]).to(probs)
    return torch.where(known.unsqueeze(-1), one_hot, probs)


def mixture_step(logits: Tensor, x_t: Tensor, kappa_t: float, kappa_next: float,
                 mask_id: int | None = None) -> Categorical:
    """The step ``t -> t + h`` of a mixture path (masked source with ``mask_id``, else uniform).

    The rate of a mixture path is linear in the posterior,
    ``u(y | x_t) = kappa'(t) / (1 - kappa(t)) * p_theta(y | x_t)`` for ``y != x_t``, so the step
    is an exact categorical: with probability ``a = (kappa(t+h) - kappa(t)) / (1 - kappa(t))`` the
    token jumps to a draw of the posterior, else it stays,
    ``P(y) = a p_theta(y | x_t) + (1 - a) [y = x_t]``. (``kappa'(t) h`` is taken as the increment
    ``kappa(t+h) - kappa(t)``: exact for the masked path's unmasking probability, and every
    probability stays in [0, 1] at any step size.) For the masked source a masked token
    unmasks with probability ``a`` to a token drawn from ``p_theta``; unmasked tokens stay."""
    if not 0.0 <= kappa_t < 1.0 or not kappa_t <= kappa_next <= 1.0:
        raise ValueError(f"a mixture step needs 0 <= kappa(t) < 1 and kappa(t) <= kappa(t+h) "
                         f"<= 1; got {kappa_t} and {kappa_next}")
    a = (kappa_next - kappa_t) / (1.0 - kappa_t)
    post = posterior(logits, x_t, mask_id)
    stay = torch.nn.functional.one_hot(x_t.long(), post.shape[-1]).to(post)
    return Categorical(a * post + (1.0 - a) * stay)


def metric_beta(t: float, c: float = 3.0, a: float = 0.9) -> tuple[float, float]:
    """``(beta_t, d beta_t / dt)`` of the metric-induced path, ``beta_t = c (t / (1 - t))^a``
    (FUDOKI: ``a = 0.9``, ``c = 3``)."""
    if not 0.0 < t < 1.0:
        raise ValueError(f"the metric path's beta is defined for 0 < t < 1; got t = {t}")
    beta = c * (t / (1.0 - t)) ** a
    return beta, beta * a / (t * (1.0 - t))


def metric_rates(x_t: Tensor, x1: Tensor, distance: Tensor, beta: float,
                 dbeta: float) -> Tensor:
    """``[..., V]`` the conditional rates ``u(y | x_t, x1)`` of the metric-induced path.

    ``u(y) = softmax(-beta_t d(x1, .))(y) * beta_t' * relu(d(x_t, x1) - d(x1, y))``, and 0 at
    ``y = x_t``: the chain only jumps to tokens closer to ``x1`` than it is.

    Args:
        x_t, x1: integer tensors of one shape (a token each).
        distance: ``[V, V]`` the metric ``d`` between tokens (symmetric, zero diagonal).
    """
    d_x1 = distance[x1.long()]  # [..., V]: d(x1, y)
    target = torch.softmax(-beta * d_x1, -1)
    closer = (distance[x_t.long(), x1.long()].unsqueeze(-1) - d_x1).clamp_min(0.0)
    rates = target * dbeta * closer
    return rates.scatter(-1, x_t.long().unsqueeze(-1), 0.0)


def metric_kernel(x_t: Tensor, x1: Tensor, distance: Tensor, t: float, h: float,
                  c: float = 3.0, a: float = 0.9) -> Tensor:
    """``[..., V]`` the step's distribution given ``x1``: the exponential form of the CTMC step,
    ``u(y) / lambda * (1 - exp(-h lambda))`` for a jump and ``exp(-h lambda)`` for a stay, with
    ``lambda = sum_y u(y)`` (the rates held at time ``t``)."""
    beta, dbeta = metric_beta(t, c, a)
    rates = metric_rates(x_t, x1, distance, beta, dbeta)
    total = rates.sum(-1, keepdim=True)
    stay = torch.exp(-h * total)
    jump = torch.where(total > 0, rates / total.clamp_min(_TINY), torch.zeros_like(rates))
    kernel = jump * (1.0 - stay)
    return kernel.scatter(-1, x_t.long().unsqueeze(-1), stay)


def metric_step(logits: Tensor, x_t: Tensor, distance: Tensor, t: float, h: float,
                c: float = 3.0, a: float = 0.9) -> Categorical:
    """The exact step of the metric-induced path: ``P(y) = sum_x1 p_theta(x1 | x_t) K(y | x_t,
    x1)``, summed over the whole vocabulary (``[B, L, V, V]`` memory: small vocabularies)."""
    post = posterior(logits, x_t)
    v = post.shape[-1]
    every = torch.arange(v, device=x_t.device)
    kernels = metric_kernel(x_t.unsqueeze(-1).expand(*x_t.shape, v), every.expand(*x_t.shape, v),
                            distance, t, h, c, a)  # [B, L, x1, y]
    return Categorical((post.unsqueeze(-1) * kernels).sum(-2))


def metric_mc_draws(old_logits: Tensor, x_t: Tensor, x_next: Tensor, distance: Tensor, t: float,
                    h: float, uniforms: Tensor, c: float = 3.0,
                    a: float = 0.9) -> tuple[Tensor, Tensor]:
    """dFlowGRPO's posterior draws of one step and their importance factors.

    ``X1_j ~ p_old(. | x_t)`` by the inverse CDF of ``uniforms`` ``[B, L, n]`` (``n = n_mc``
    draws per token), and ``factor_j = K_j(x_next) / p_old(X1_j)``, the kernel of the realised
    next token given ``X1_j`` over the draw's old probability. Returns ``(draws [B, L, n] long,
    factors [B, L, n] float32)``; :func:`metric_mc_log_prob` turns them into the estimate under
    any policy. Both are fixed per rollout, so the old and the new policy share them."""
    old = posterior(old_logits.detach(), x_t)
    b, length, n = uniforms.shape
    cdf = old.cumsum(-1)  # [B, L, V]
    u = uniforms.to(torch.float32).unsqueeze(-1) * cdf[..., -1:].unsqueeze(-2)  # [B, L, n, 1]
    draws = (cdf.unsqueeze(-2) <= u).sum(-1).clamp_max(old.shape[-1] - 1)  # [B, L, n]
    here = x_t.long().unsqueeze(-1).expand_as(draws)
    kernels = metric_kernel(here, draws, distance, t, h, c, a)  # [B, L, n, V]
    k_next = kernels.gather(-1, x_next.long()[..., None, None].expand(b, length, n, 1))
    factors = k_next.squeeze(-1) / old.gather(-1, draws).clamp_min(_TINY)
    return draws, factors


def metric_mc_log_prob(logits: Tensor, x_t: Tensor, draws: Tensor, factors: Tensor) -> Tensor:
    """``[B, L]`` the Monte-Carlo step log-probability under the policy of ``logits``:
    ``log (1/n) sum_j p_theta(X1_j | x_t) factor_j`` (gradient through ``p_theta``)."""
    post = posterior(logits, x_t)
    estimate = (post.gather(-1, draws) * factors).mean(-1)
    return estimate.clamp_min(_TINY).log()


def metric_step_log_prob_mc(logits: Tensor, old_logits: Tensor, x_t: Tensor, x_next: Tensor,
                            distance: Tensor, t: float, h: float, n_mc: int,
                            generator: torch.Generator | None = None, c: float = 3.0,
                            a: float = 0.9) -> Tensor:
    """``[B, L]`` dFlowGRPO's Monte-Carlo estimate of each token's step log-probability.

    Draws ``X1_j ~ p_old(. | x_t)`` (``j < n_mc``) and averages the importance-weighted kernels,
    ``P_theta(x_next) ~ (1/n) sum_j p_theta(X1_j) K_j(x_next) / p_old(X1_j)``: an unbiased estimate
    of :func:`metric_step`'s probability whose spread falls as ``1 / sqrt(n_mc)``. At
    ``logits == old_logits`` every weight is 1, so the ratio of two estimates made from the same
    draws is exactly 1 before an update. (:func:`metric_mc_draws` then
    :func:`metric_mc_log_prob`.)"""
    if n_mc < 1:
        raise ValueError(f"n_mc must be a positive integer; got {n_mc}")
    uniforms = torch.rand(*x_t.shape, n_mc, generator=generator, device=x_t.device)
    draws, factors = metric_mc_draws(old_logits, x_t, x_next, distance, t, h, uniforms, c, a)
    return metric_mc_log_prob(logits, x_t, draws, factors)


@dataclass(frozen=True)
class TokenPath:
    """The probability path a discrete model was trained on; the adapter owns it, the ``ctmc``
    sampler steps along it.

    Time runs from the source at ``t = 0`` to the data at ``t = 1``; a schedule's noise level is
    ``sigma = 1 - t`` (``kappa(t) = t``), so the grids of both state spaces descend from 1 to 0.

    Attributes:
        kind: ``"masked"`` (source: every token the mask), ``"uniform"`` (source: uniform tokens)
            or ``"metric"`` (FUDOKI's metric-induced path; source uniform).
        num_states: ``S``, the values a token takes (the mask included); the model's logits
            have ``S`` columns (the mask's column is ignored).
        mask_id: the mask token (masked path only).
        distance: ``[S, S]`` the metric between tokens (metric path only).
        c, a: the metric path's ``beta_t = c (t / (1 - t))^a``.
        t_min: the earliest time the metric path's rates are evaluated at (``beta'`` is
            infinite at ``t = 0``).
    """

    kind: str
    num_states: int
    mask_id: int | None = None
    distance: Tensor | None = None
    c: float = 3.0
    a: float = 0.9
    t_min: float = 1e-3

    def __post_init__(self) -> None:
        if self.kind not in PATHS:
            raise ValueError(f"unknown token path {self.kind!r}; valid: {', '.join(PATHS)}")
        if (self.kind == "masked") != (self.mask_id is not None):
            raise ValueError("a masked path needs its mask_id, and only a masked path has one")
        if self.kind == "metric" and self.distance is None:
            raise ValueError("a metric path needs the distance between tokens")

    def source(self, shape: tuple[int, ...], generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> Tensor:
        """``[*shape]`` long draws of the source: all masks, or uniform tokens."""
        if self.kind == "masked":
            return torch.full(shape, self.mask_id, dtype=torch.long, device=device)
        return torch.randint(0, self.num_states, shape, generator=generator, device=device)

    def corrupt(self, x1: Tensor, sigma: Tensor | float,
                generator: torch.Generator | None = None) -> Tensor:
        """A draw of ``x_t ~ p_t(. | x1)`` at ``t = 1 - sigma`` (``sigma`` a float or ``[B]``):
        the forward process, token by token."""
        s = torch.as_tensor(sigma, dtype=torch.float32, device=x1.device)
        s = s.reshape(-1, *([1] * (x1.ndim - 1))) if s.ndim else s
        if self.kind == "metric":
            t = (1.0 - s).clamp(self.t_min, 1.0 - 1e-6)
            beta = self.c * (t / (1.0 - t)) ** self.a
            probs = torch.softmax(-beta.unsqueeze(-1) * self.distance.to(x1.device)[x1], -1)
            return Categorical(probs).sample(generator)
        keep = torch.rand(x1.shape, generator=generator, device=x1.device) >= s
        other = self.source(tuple(x1.shape), generator, x1.device)
        return torch.where(keep, x1, other)


def distinct_steps(sigma: Sigma, sigma_next: Sigma,
                   batch: int) -> list[tuple[float, float, Tensor]]:
    """``(s, s', rows)`` for each distinct step in a batch of ``batch`` rows."""
    if not isinstance(sigma, Tensor) and not isinstance(sigma_next, Tensor):
        return [(float(sigma), float(sigma_next), torch.arange(batch))]
    s = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1).expand(batch).cpu()
    n = torch.as_tensor(sigma_next, dtype=torch.float64).reshape(-1).expand(batch).cpu()
    pairs = torch.stack([s, n], 1)
    return [(float(a), float(b), (pairs == torch.tensor([a, b])).all(1).nonzero().flatten())
            for a, b in torch.unique(pairs, dim=0).tolist()]


class TokenSampler(Sampler):
    """A sampler of token states: always stochastic (a chain has no deterministic step), without
    parameters; subclasses take what they step along from the adapter in :meth:`bind`."""

    state_space = TOKENS

    @property
    def is_stochastic(self) -> bool:
        return True

    def config(self) -> dict[str, Any]:
        return {}


@SAMPLERS.register("ctmc")
class CTMC(TokenSampler):
    """The exact step of a discrete flow along the model's token path (docs/design.md,
    "Discrete steps"): :func:`mixture_step` for the masked and uniform sources,
    :func:`metric_step` (summed over the vocabulary) for the metric-induced path. The step into
    ``sigma' = 0`` draws the clean tokens from the posterior itself.

    It steps in token states: ``bind`` it to a discrete adapter (the trainer does) before use.
    Its steps into ``sigma' = 0`` are not trained (dFlowGRPO's default: the last step excluded).
    """

    name = "ctmc"

    def __init__(self) -> None:
        self.path: TokenPath | None = None

    def bind(self, adapter: Any) -> CTMC:
        super().bind(adapter)
        self.path = adapter.path
        return self

    def transition(self, v: Tensor, x: Tensor, sigma: Sigma, sigma_next: Sigma,
                   velocity_fn: VelocityFn | None = None) -> Categorical:
        """``[B, L, S]`` per-token categorical of the next tokens given the posterior logits
        ``v`` ``[B, L, S]`` at tokens ``x`` ``[B, L]`` and noise level ``sigma``."""
        path = self.path
        if path is None:
            raise ValueError("the ctmc sampler is not bound to a model: call sampler.bind(adapter)")
        if v.shape[:-1] != x.shape or v.shape[-1] != path.num_states:
            raise ValueError(f"logits {tuple(v.shape)} must be the tokens' shape {tuple(x.shape)} "
                             f"plus the path's {path.num_states} states")
        probs = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        for s, s_next, rows in distinct_steps(sigma, sigma_next, x.shape[0]):
            rows = rows.to(v.device)
            probs[rows] = self._step(v[rows], x[rows], s, s_next).probs
        return Categorical(probs)

    def _step(self, logits: Tensor, x: Tensor, s: float, s_next: float) -> Categorical:
        path = self.path
        if s_next <= 0.0:  # into the data: the clean tokens themselves
            return Categorical(posterior(logits, x, path.mask_id))
        if path.kind == "metric":
            t = min(max(1.0 - s, path.t_min), 1.0 - 1e-6)
            return metric_step(logits, x, path.distance.to(logits.device), t, s - s_next,
                               path.c, path.a)
        return mixture_step(logits, x, 1.0 - s, 1.0 - s_next, path.mask_id)
