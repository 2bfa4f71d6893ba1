"""The sampler contract and the sampler-independent Gaussian math.

A sampler turns one model velocity into the Gaussian of the next latent (docs/design.md,
"Samplers"). Everything that does not depend on which sampler made the Gaussian
lives here: drawing ``x'``, the log-density of a stored ``x'`` and the KL between two transitions
from the same ``x``.

Conventions: ``x_s = (1 - s) * x0 + s * eps``, velocity ``v ~ eps - x0``, a step goes from
``s`` to ``s' < s`` with ``dt = s' - s < 0``; ``x0_hat = x - s*v``, ``eps_hat = x + (1-s)*v``.
All step math is float32 whatever the dtype of the model's output.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from flowgrpo.registry import Registry

from .spaces import CONTINUOUS, StateSpace

SAMPLERS: Registry[type[Sampler]] = Registry("sampler")
"""Sampler classes by name; ``SAMPLERS.build(name, **params)`` builds one (see :func:`build`)."""

Sigma = float | Tensor
"""A noise level: a Python float shared by the batch or a ``[B]`` tensor (one per sample)."""

VelocityFn = Callable[[Tensor, Tensor], Tensor]
"""``velocity_fn(x, sigma) -> v``: ``x`` ``[B, ...]``, ``sigma`` ``[B]``, ``v`` shaped like x."""

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class Transition:
    """The Gaussian ``N(mean, std^2 I)`` of the next latent.

    The rollout and the replay use a transition only through :meth:`sample`, :meth:`log_prob`
    and :meth:`kl`, so the distribution's kind stays the sampler's business
    (docs/design.md, "Conventions").

    Attributes:
        mean: ``[B, ...]`` float32, shaped like ``x``.
        std: ``[B, 1, ..., 1]`` float32, one scalar per sample, broadcastable to ``mean``;
            zeros for a deterministic step.
    """

    mean: Tensor
    std: Tensor

    def sample(self, generator: torch.Generator | None = None,
               noise: Tensor | None = None) -> Tensor:
        """A draw of the next latent: :func:`sample_next`."""
        return sample_next(self, generator, noise)

    def log_prob(self, x_next: Tensor, weight: Tensor | None = None) -> Tensor:
        """``[B]`` log-density of a realised next latent: :func:`gaussian_log_prob`."""
        return gaussian_log_prob(x_next, self.mean, self.std, weight=weight)

    def kl(self, other: Transition, weight: Tensor | None = None) -> Tensor:
        """``[B]`` ``KL(self || other)`` of two steps from the same ``x`` with this std:
        :func:`gaussian_kl`."""
        return gaussian_kl(self.mean, other.mean, self.std, weight=weight)


def broadcast_sigma(sigma: Sigma, x: Tensor) -> Tensor:
    """A float or ``[B]`` noise level as a float32 ``[B, 1, ..., 1]`` tensor on ``x``'s device.

    Args:
        sigma: a Python float, a 0-d tensor, or a tensor with ``B`` elements (``[B]`` or
            already ``[B, 1, ..., 1]``).
        x: ``[B, ...]`` the latent the noise level belongs to.
    """
    batch = x.shape[0]
    s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
    if s.numel() == 1:
        s = s.reshape(1).expand(batch).clone()
    elif s.numel() != batch:
        raise ValueError(
            f"sigma must be a float or hold one value per sample ({batch}); got shape "
            f"{tuple(s.shape)}"
        )
    return s.reshape(batch, *([1] * (x.ndim - 1)))


class StepInputs(NamedTuple):
    """One step's inputs in float32; ``s``, ``s_next`` and ``dt`` are ``[B, 1, ..., 1]``."""

    v: Tensor
    x: Tensor
    s: Tensor
    s_next: Tensor
    dt: Tensor

    def euler(self) -> Tensor:
        """The Euler (ODE) mean ``x + dt * v``; every sampler at zero noise returns exactly this."""
        return self.x + self.dt * self.v

    def eps_hat(self) -> Tensor:
        """Noise prediction ``x + (1 - s) * v``."""
        return self.x + (1.0 - self.s) * self.v

    def zero_std(self) -> Tensor:
        """A ``[B, 1, ..., 1]`` float32 zero std (deterministic step)."""
        return torch.zeros_like(self.s)


def step_inputs(v: Tensor, x: Tensor, sigma: Sigma, sigma_next: Sigma) -> StepInputs:
    """Cast a step's inputs to float32 and shape the noise levels per sample.

    Args:
        v: ``[B, ...]`` velocity at ``(x, sigma)``, any floating dtype.
        x: ``[B, ...]`` current latent, any floating dtype.
        sigma, sigma_next: floats or ``[B]`` tensors with ``sigma_next < sigma``.
    """
    if v.shape != x.shape:
        raise ValueError(f"v {tuple(v.shape)} and x {tuple(x.shape)} must have the same shape")
    x32 = x.to(torch.float32)
    s = broadcast_sigma(sigma, x32)
    s_next = broadcast_sigma(sigma_next, x32)
    return StepInputs(v.to(torch.float32), x32, s, s_next, s_next - s)


class Sampler:
    """A rule that maps ``(v, x, s, s')`` to the Gaussian of the next latent.

    Subclasses set :attr:`name`, take their parameters as keyword constructor arguments (saved as
    attributes of the same name, returned by :meth:`config`) and implement :meth:`transition`
    and :attr:`is_stochastic`.
    """

    name: ClassVar[str] = ""
    # the kind of state the sampler steps in (samplers.spaces): latents unless it says tokens
    state_space: ClassVar[StateSpace] = CONTINUOUS
    # steps into s' below this are not trained (see :meth:`trainable`); samplers whose steps
    # into tiny noise levels are ill conditioned (cps, langevin) take it as a parameter
    min_train_sigma: float = 0.0

    @property
    def is_stochastic(self) -> bool:
        """False when the parameters make every step's std 0 (the sampler is the Euler ODE)."""
        raise NotImplementedError

    @property
    def needs_model_call(self) -> bool:
        """True when :meth:`transition` calls ``velocity_fn`` (a second model call per step)."""
        return False

    def bind(self, adapter: Any) -> Sampler:
        """Take what the sampler needs from the model it samples (a discrete sampler reads the
        adapter's token path) and return ``self``; a one-line ``ValueError`` when the sampler's
        state space is not the adapter's (a Gaussian sampler for a token model, or the reverse).
        """
        space = getattr(adapter, "state_space", CONTINUOUS)
        if space is not self.state_space:
            raise ValueError(
                f"sampler {self.name!r} steps in {self.state_space.name} states but the model "
                f"generates {space.name}: choose a sampler of its kind (flowgrpo list samplers)")
        return self

    def trainable(self, sigma: float, sigma_next: float) -> bool:
        """Whether the step ``sigma -> sigma_next`` is stochastic and well conditioned enough to
        train by its ratio (step selections skip the others: every one, and a window ends at the
        last trainable step). A deterministic sampler has no trainable step, nor has any sampler
        a step into ``s' < min_train_sigma``."""
        return self.is_stochastic and sigma_next > 0.0 and sigma_next >= self.min_train_sigma

    def transition(
        self,
        v: Tensor,
        x: Tensor,
        sigma: Sigma,
        sigma_next: Sigma,
        velocity_fn: VelocityFn | None = None,
    ) -> Transition:
        """The Gaussian of ``x'`` given the velocity ``v`` at ``(x, sigma)``.

        Args:
            v: ``[B, ...]`` model velocity at ``(x, sigma)`` (any dtype; math runs in float32).
            x: ``[B, ...]`` current latent.
            sigma: current noise level ``s``, a float or ``[B]`` tensor.
            sigma_next: next noise level ``s' < s``, a float or ``[B]`` tensor.
            velocity_fn: ``(x [B, ...], sigma [B]) -> v``; used only when
                :attr:`needs_model_call` is True.

        Returns:
            :class:`Transition` with ``mean`` ``[B, ...]`` and ``std`` ``[B, 1, ..., 1]``.
        """
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """The constructor arguments, so that ``get(s.name, **s.config())`` rebuilds ``s``."""
        return {k: getattr(self, k) for k in _init_params(type(self))}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def check_min_train_sigma(name: str, value: float) -> float:
    """``value`` as a float when it is a valid ``min_train_sigma`` (in ``[0, 1)``), else a
    one-line ``ValueError`` naming the sampler."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} min_train_sigma must be in [0, 1), got {value}")
    return float(value)


def _init_params(cls: type) -> list[str]:
    """Names of the keyword-passable constructor arguments of ``cls`` (its parameters)."""
    if cls.__init__ is object.__init__:
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # drop self
    return [p.name for p in params if p.kind in kinds]


def sample_next(
    transition: Transition,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """Draw ``x' = mean + std * noise``, noise ``~ N(0, I)``; ``[B, ...]`` float32.

    Args:
        transition: the step's Gaussian.
        generator: the generator for the noise (on ``mean``'s device) when ``noise`` is None.
        noise: ``[B, ...]`` given standard-normal noise (cast to float32), e.g. to replay or to
            share randomness between samplers.
    """
    mean = transition.mean
    if noise is None:
        noise = torch.randn(
            mean.shape, generator=generator, device=mean.device, dtype=torch.float32
        )
    return mean + transition.std * noise.to(torch.float32)


def _check_trainable(std: Tensor) -> Tensor:
    std = std.to(torch.float32)
    if bool((std == 0).any()):
        raise ValueError(
            "std is 0 for some sample: a deterministic (ODE) step has no density and cannot be "
            "trained; train only the stochastic steps (see samplers.Window)"
        )
    return std


def _mean_over_elements(t: Tensor) -> Tensor:
    return t.mean(dim=tuple(range(1, t.ndim))) if t.ndim > 1 else t


def gaussian_log_prob(
    x_next: Tensor, mean: Tensor, std: Tensor, weight: Tensor | None = None
) -> Tensor:
    """Full Gaussian log-density of ``x'`` under ``N(mean, std^2 I)``, reduced per sample.

    Per element ``lp = -(x' - mean)^2 / (2 std^2) - log(std) - 0.5 log(2 pi)``; the result is
    ``mean(lp)`` over the non-batch dims, or ``mean(weight * lp)`` when ``weight`` is given.
    The weighted form is a plain mean, not ``sum(w * lp) / sum(w)``: region weights may be signed
    (region advantages) or sum to 0, and ``weight = 1`` reproduces the unweighted value exactly.

    Args:
        x_next: ``[B, ...]`` the realized next latent.
        mean: ``[B, ...]`` the transition mean.
        std: ``[B, 1, ..., 1]`` (or anything broadcastable to ``x_next``), all > 0.
        weight: optional per-position map broadcastable to ``x_next`` (e.g. ``[B, 1, h, w]``).

    Returns:
        ``[B]`` float32.

    Raises:
        ValueError: if any std is 0 (a deterministic step).
    """
    std = _check_trainable(std)
    diff = x_next.to(torch.float32) - mean.to(torch.float32)
    lp = -(diff**2) / (2.0 * std**2) - torch.log(std) - _HALF_LOG_2PI
    if weight is not None:
        lp = lp * weight.to(torch.float32)
    return _mean_over_elements(lp)


def gaussian_kl(mean_a: Tensor, mean_b: Tensor, std: Tensor,
                weight: Tensor | None = None) -> Tensor:
    """KL between two transitions from the same ``x`` with the same std; ``[B]`` float32.

    ``KL(N(a, std^2 I) || N(b, std^2 I))`` per element is ``(a - b)^2 / (2 std^2)``, exact (the
    step's ``dt`` is inside ``std``); averaged over the non-batch dims like the log-prob.

    Args:
        mean_a, mean_b: ``[B, ...]`` transition means (policy and reference).
        std: ``[B, 1, ..., 1]`` shared std, all > 0.
        weight: optional per-position map broadcastable to the means: ``mean(weight * kl)``,
            as :func:`gaussian_log_prob` weighs.

    Raises:
        ValueError: if any std is 0 (a deterministic step).
    """
    std = _check_trainable(std)
    diff = mean_a.to(torch.float32) - mean_b.to(torch.float32)
    kl = diff**2 / (2.0 * std**2)
    if weight is not None:
        kl = kl * weight.to(torch.float32)
    return _mean_over_elements(kl)


def build(name: str, **params: Any) -> Sampler:
    """Build the sampler registered as ``name`` with its parameters.

    Raises:
        flowgrpo.registry.UnknownNameError: unknown ``name`` (the message lists valid names).
        flowgrpo.registry.ParameterError: a parameter the sampler does not take (a ValueError
            naming the closest one it takes and all of them).
    """
    return SAMPLERS.build(name, **params)


get = build
"""The name code written before :func:`build` uses; it builds too."""


def names() -> list[str]:
    """Registered sampler names, sorted."""
    return SAMPLERS.names()
