"""The one place that turns model output into what rewards expect.

Pipelines decode to plain tensors (DESIGN.md): image ``[B, 3, H, W]`` in [0, 1], video
``[B, F, 3, H, W]`` in [0, 1], audio ``[B, C, T]`` in [-1, 1] plus a sample rate. The trainer wraps
them in :class:`Media`; rewards call the converters below instead of guessing layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("image", "video", "audio")


@dataclass
class Media:
    """A batch of generated media.

    Attributes:
        kind: ``"image"``, ``"video"`` or ``"audio"``.
        data: image ``[B, 3, H, W]`` / video ``[B, F, 3, H, W]`` in [0, 1]; audio ``[B, C, T]``.
        sample_rate: audio samples per second (audio only).
    """

    kind: str
    data: torch.Tensor
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown media kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")
        want = {"image": 4, "video": 5, "audio": 3}[self.kind]
        if self.data.dim() != want:
            raise ValueError(
                f"{self.kind} media must have {want} dims, got shape {tuple(self.data.shape)}"
            )
        if self.kind == "audio" and not self.sample_rate:
            raise ValueError("audio media needs a sample_rate")

    def __len__(self) -> int:
        return self.data.shape[0]

    def index(self, idx: torch.Tensor | list[int] | slice) -> "Media":
        """The sub-batch ``idx`` (same kind and sample rate)."""
        return Media(self.kind, self.data[idx], self.sample_rate)


def require(media: Media, *kinds: str, reward: str) -> None:
    """Raise a clear error when ``reward`` cannot score media of this kind."""
    if not isinstance(media, Media):
        raise TypeError(f"reward {reward!r} expects a reward_models.Media, got {type(media).__name__}")
    if media.kind not in kinds:
        raise ValueError(
            f"reward {reward!r} scores {' or '.join(kinds)} media, got {media.kind} media"
        )


def as_frames(media: Media) -> tuple[torch.Tensor, int]:
    """Images as ``[N, 3, H, W]`` float32 in [0, 1] and the number of frames per sample.

    Video ``[B, F, 3, H, W]`` is flattened to ``[B*F, 3, H, W]`` (frames per sample ``F``) so that
    an image reward scores every frame; average back with :func:`average_frames`.
    """
    require(media, "image", "video", reward="image reward")
    data = media.data.float().clamp(0, 1)
    if media.kind == "image":
        return data, 1
    b, f = data.shape[:2]
    return data.reshape(b * f, *data.shape[2:]), f


def average_frames(scores: torch.Tensor, frames: int) -> torch.Tensor:
    """Per-frame scores ``[B*F]`` -> per-sample mean ``[B]``."""
    return scores.reshape(-1, frames).mean(dim=1)


def to_uint8_hwc(images: torch.Tensor) -> torch.Tensor:
    """``[N, 3, H, W]`` in [0, 1] -> ``[N, H, W, 3]`` uint8 (PIL / numpy / OCR layout)."""
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
