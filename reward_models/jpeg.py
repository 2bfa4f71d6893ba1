"""Weight-free JPEG rewards from DDPO (Black et al. 2023, "Training Diffusion Models with
Reinforcement Learning"): the size of the JPEG-encoded image.

``jpeg_incompressibility`` is the size in kB (1 kB = 1000 bytes) of the image saved by Pillow as
a baseline JPEG at ``quality`` (default 95, as in DDPO); ``jpeg_compressibility`` is its negation,
so that higher is better in both. Video scores are averaged over frames.
"""

from __future__ import annotations

import io

import torch

from .base import Reward, RewardOutput, register
from .media import Media, as_frames, average_frames, to_uint8_hwc


def jpeg_kilobytes(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """Sizes ``[N]`` float32 in kB of ``images`` ``[N, 3, H, W]`` in [0, 1] encoded as JPEG.

    Pixels are rounded to uint8 first; Pillow's encoder with default chroma subsampling and no
    optimization pass, so the size depends only on the pixels and ``quality``.
    """
    from PIL import Image

    sizes = []
    for array in to_uint8_hwc(images).numpy():
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


def _jpeg_reward(sign: float, name: str, quality: int) -> Reward:
    if not 1 <= quality <= 100:
        raise ValueError(f"reward {name!r}: quality must be 1..100 (Pillow's scale), got {quality}")

    def reward(media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        frames, per_sample = as_frames(media)
        kilobytes = average_frames(jpeg_kilobytes(frames, quality), per_sample)
        return RewardOutput(scores=sign * kilobytes, info={"jpeg_kb": kilobytes.mean().item()})

    return reward


@register("jpeg_compressibility")
def jpeg_compressibility(quality: int = 95) -> Reward:
    """Minus the JPEG size in kB (smaller files score higher); ``quality`` as in Pillow."""
    return _jpeg_reward(-1.0, "jpeg_compressibility", quality)


@register("jpeg_incompressibility")
def jpeg_incompressibility(quality: int = 95) -> Reward:
    """The JPEG size in kB (larger files score higher); ``quality`` as in Pillow."""
    return _jpeg_reward(1.0, "jpeg_incompressibility", quality)
