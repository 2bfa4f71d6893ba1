"""The adapter interface every model family implements, and the family registry.

An adapter owns only what is model-specific (DESIGN.md, "Pipelines"): prompt encoding, initial
noise, the shifted schedule, the single model call (with CFG or a guidance embedding), decoding,
and how a LoRA is saved so that the family's diffusers pipeline loads it back. Samplers, losses and
the trainer never see model units (timesteps) or latent packing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from flowgrpo.registry import Registry


@dataclass
class Cond:
    """Prompt encodings; every tensor has the batch on dim 0.

    Negative (unconditional) encodings, when the family uses CFG, are stored per sample too
    (``neg_*`` keys), so that any sub-batch of a rollout can be replayed with :meth:`index`.
    """

    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def index(self, idx: torch.Tensor | list[int] | slice) -> "Cond":
        """The sub-batch ``idx``."""
        return Cond({k: v[idx] for k, v in self.tensors.items()})

    def to(self, device: torch.device | str) -> "Cond":
        return Cond({k: v.to(device) for k, v in self.tensors.items()})

    @staticmethod
    def cat(conds: list["Cond"]) -> "Cond":
        """Concatenate along the batch."""
        return Cond({k: torch.cat([c.tensors[k] for c in conds]) for k in conds[0].tensors})


class FlowAdapter(ABC):
    """A flow-matching generator seen through the conventions of DESIGN.md.

    Attributes:
        modality: ``"image"``, ``"video"`` or ``"audio"`` (what :meth:`decode` returns).
        sample_rate: audio samples per second (audio families only).
        transformer: the module LoRA wraps and the optimizer trains.
        pipeline: the underlying diffusers pipeline (components, ``load_lora_weights``).
        default_lora_targets: module names a LoRA targets by default for this family.
    """

    modality: str = "image"
    sample_rate: int | None = None
    default_lora_targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
    transformer: torch.nn.Module
    pipeline: Any

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    @abstractmethod
    def encode(self, prompts: list[str]) -> Cond:
        """Text (and negative) embeddings for ``prompts``; computed without gradients."""

    @abstractmethod
    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Initial latents at sigma = 1, float32 on :attr:`device`, e.g. ``[n, C, h, w]``."""

    @abstractmethod
    def schedule(self, num_steps: int) -> torch.Tensor:
        """Descending float32 sigmas ``[num_steps + 1]`` with the model's shift, last = 0."""

    @abstractmethod
    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """The model's velocity ``v ~ eps - x0`` at ``(x, sigma)``, shaped like ``x``.

        Args:
            x: latents (float32 or the model dtype).
            sigma: ``[B]`` noise levels in [0, 1] (the adapter converts to its own units).
            cond: encodings of the same batch.
            guidance: CFG scale (or guidance-embedding value); CFG runs as one batched call.
        """

    @abstractmethod
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents at sigma = 0 -> media tensor (image ``[B,3,H,W]`` in [0,1], ...)."""

    @abstractmethod
    def save_lora(self, directory: str, lora_state_dict: dict[str, torch.Tensor]) -> None:
        """Write a LoRA so that this family's diffusers pipeline ``load_lora_weights`` reads it."""

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Map region scores ``[B, h, w]`` on the image grid onto the latent grid.

        The default covers ``[B, C, H', W']`` latents: the image grid is resized (area average) to
        the latent's spatial size, because a latent position summarises a VAE-downsampled patch.
        Returns a tensor broadcastable to ``latents``. Families with packed or 5-D latents override.
        """
        if latents.dim() != 4:
            raise NotImplementedError(f"{type(self).__name__} does not map regions to its latents")
        grid = F.interpolate(regions[:, None].float(), size=latents.shape[-2:], mode="area")
        return grid

    def offload_encoders(self, device: torch.device | str = "cpu") -> None:
        """Move text encoders and VAE to ``device`` (e.g. off the accelerator after encoding)."""

    def to(self, device: torch.device | str) -> "FlowAdapter":
        self.pipeline.to(device)
        return self


FAMILIES: Registry[Callable[..., FlowAdapter]] = Registry("pipeline family")
register = FAMILIES.register


def load(family: str, path_or_id: str, **options: Any) -> FlowAdapter:
    """Load ``path_or_id`` (hub id or local folder) as the adapter of ``family``."""
    return FAMILIES.get(family)(path_or_id, **options)


def names() -> list[str]:
    """Registered family names."""
    return FAMILIES.names()
