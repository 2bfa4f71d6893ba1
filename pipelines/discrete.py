"""The discrete adapter contract: a model that generates token sequences (docs/adapters.md,
"Discrete families").

A discrete family's states are tokens ``[B, L]`` (long) over ``S`` states, the mask included for
a masked path. Its one model call returns the posterior logits ``p_theta(x1 | x_t, cond)``
``[B, L, S]`` with classifier-free guidance applied to the logits; its schedule is the time grid
as noise levels ``sigma = 1 - t`` descending from 1 (the source) to 0 (the data); its
:attr:`path` says which probability path the model was trained on, which the ``ctmc`` sampler
steps along. Everything else (encoding, decoding to media, saving a LoRA) is the
:class:`~pipelines.base.FlowAdapter` contract unchanged.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F

from samplers import TOKENS, TokenPath

from .base import Cond, FlowAdapter


class DiscreteAdapter(FlowAdapter):
    """A discrete flow model seen through the conventions.

    Subclasses set :attr:`path` (a :class:`samplers.TokenPath`) and :attr:`token_shape` (the grid
    the ``L = prod(token_shape)`` tokens lie on, e.g. ``(h, w)`` of a VQ image) and implement
    :meth:`logits`, :meth:`encode` and :meth:`decode`.

    Attributes:
        path: the model's token path (source, number of states, mask id, metric).
        token_shape: the token grid; region rewards map onto it (:meth:`position_weights`).
        default_sampler: the sampler a rollout of this model is checked with: ``ctmc`` along
            :attr:`path`, or a family's own (``vq_diffusion``: its mask-and-replace chain).
    """

    state_space = TOKENS
    default_sampler: str = "ctmc"
    path: TokenPath
    token_shape: tuple[int, ...]

    @property
    def seq_len(self) -> int:
        """``L``, the tokens per sample."""
        return int(torch.tensor(self.token_shape).prod())

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, L]`` long source tokens (all masks, or uniform draws from ``generator``)."""
        return self.path.source((n, self.seq_len), generator, self.device)

    def schedule(self, num_steps: int) -> torch.Tensor:
        """``[num_steps + 1]`` float32 noise levels ``1 -> 0``, uniform in time by default."""
        return torch.linspace(1.0, 0.0, num_steps + 1)

    @abstractmethod
    def logits(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
               guidance: float) -> torch.Tensor:
        """``[B, L, S]`` posterior logits of the clean tokens at tokens ``x`` ``[B, L]`` and
        noise levels ``sigma`` ``[B]`` (CFG on the logits as one batched call)."""

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
                 guidance: float) -> torch.Tensor:
        """The model call of the rollout and the replay: :meth:`logits`."""
        return self.logits(x, sigma, cond, guidance)

    def corrupt(self, x1: torch.Tensor, sigma: torch.Tensor | float,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """The forward process: ``x_t ~ p_t(. | x1)`` at noise level ``sigma`` (the path's)."""
        return self.path.corrupt(x1, sigma, generator)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the image grid as ``[B, L]`` token weights: area-averaged
        onto :attr:`token_shape` and flattened in the tokens' order."""
        if len(self.token_shape) != 2:
            raise NotImplementedError(f"{type(self).__name__} does not map regions to its tokens")
        grid = F.interpolate(regions[:, None].float(), size=self.token_shape, mode="area")
        return grid.flatten(1)
