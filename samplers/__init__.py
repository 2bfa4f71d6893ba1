"""Samplers: from a velocity to the Gaussian of the next latent (docs/design.md, "Samplers").

``build(name, **params)`` builds a registered sampler (``names()`` lists them); its
``transition(v, x, s, s')`` returns a :class:`Transition` ``(mean, std)``. Drawing ``x'``, the
log-density of a stored ``x'`` and the KL between two transitions are shared functions of the
Gaussian (:func:`sample_next`, :func:`gaussian_log_prob`, :func:`gaussian_kl`). Token models
step with ``ctmc`` (:mod:`samplers.discrete`): a per-token :class:`Categorical` along the
adapter's :class:`TokenPath`, or with ``vq_diffusion`` (:mod:`samplers.vq_diffusion`) along
VQ-Diffusion's mask-and-replace chain; :mod:`samplers.spaces` says how each kind of state is
stored.
:class:`Window` picks the trained steps (MixGRPO); :func:`dpm_solver_2m` and
:func:`flash_sigmas` solve the part after the window (MixGRPO-Flash). Importing this package
needs only torch.
"""

from . import cps, discrete, langevin, ode, sde, vq_diffusion  # noqa: F401  (importing registers the samplers)
from .base import (
    SAMPLERS,
    Sampler,
    Sigma,
    Transition,
    VelocityFn,
    broadcast_sigma,
    build,
    gaussian_kl,
    gaussian_log_prob,
    get,
    names,
    sample_next,
    step_inputs,
)
from .discrete import CTMC, Categorical, TokenPath
from .dpm import dpm_solver_2m, flash_sigmas
from .spaces import CONTINUOUS, TOKENS, StateSpace
from .vq_diffusion import MaskReplaceSchedule, VQDiffusion
from .window import Window

__all__ = [
    "CONTINUOUS",
    "CTMC",
    "SAMPLERS",
    "TOKENS",
    "Categorical",
    "MaskReplaceSchedule",
    "StateSpace",
    "TokenPath",
    "VQDiffusion",
    "Sampler",
    "Sigma",
    "Transition",
    "VelocityFn",
    "Window",
    "broadcast_sigma",
    "build",
    "dpm_solver_2m",
    "flash_sigmas",
    "gaussian_kl",
    "gaussian_log_prob",
    "get",
    "names",
    "sample_next",
    "step_inputs",
]
