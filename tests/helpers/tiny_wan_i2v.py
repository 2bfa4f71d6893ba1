"""Tiny ``WanImageToVideoPipeline`` models built in code (no hub, no download), for tests:

- :func:`tiny_wan_i2v_pipeline`: Wan2.1 I2V-like: a CLIP vision tower and its image processor,
  a transformer with image cross-attention (``image_dim``, ``added_kv_proj_dim``) taking
  ``16 + 4 + 16`` input channels over the Wan2.1 VAE; 5 frames of 16x16 -> latents
  ``[16, 2, 2, 2]``.
- :func:`tiny_wan22_i2v_a14b_pipeline`: Wan2.2 I2V-A14B-like: two experts split at
  ``boundary_ratio`` (0.9, I2V-A14B's), no image encoder.
- :func:`tiny_wan22_ti2v_i2v_pipeline`: Wan2.2 TI2V-5B-like (``expand_timesteps``): the Wan2.2
  VAE, a transformer on the latent channels only; 5 frames of 32x64 -> latents ``[8, 2, 2, 4]``.

Each builder seeds torch before every component, so two calls with the same ``seed`` give
pipelines with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import numpy as np
import torch

from helpers import ROOT
from helpers.tiny import tiny_clip_tokenizer
from helpers.tiny_families import tiny_t5_encoder
from helpers.tiny_video import WAN22_Z, tiny_wan22_vae

FIRST_FRAME = str(ROOT / "configs" / "prompts" / "i2v" / "harbor.png")
"""A shipped first frame (the recipe's example prompt set), the tiny cases' default ``image``."""

CLIP_DIM = 16
"""Hidden size of the tiny CLIP vision tower (the transformer's ``image_dim``)."""


def picture(height: int, width: int, seed: int = 0):
    """A random RGB PIL image."""
    from PIL import Image

    pixels = np.random.RandomState(seed).rand(height, width, 3) * 255
    return Image.fromarray(pixels.astype(np.uint8))


def _transformer(seed: int, channels: int, out: int, image: bool = False):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    extra = dict(image_dim=CLIP_DIM, added_kv_proj_dim=24) if image else {}
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=channels, out_channels=out, text_dim=32, freq_dim=256, ffn_dim=32,
        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        **extra,
    ).eval()


def _wan21_vae(seed: int):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.05 * i - 0.4 for i in range(16)],
        latents_std=[0.6 + 0.05 * i for i in range(16)],
    ).eval()


def tiny_clip_vision(seed: int = 0):
    """A 2-layer ``CLIPVisionModel`` on 32x32 crops in 8x8 patches: 17 tokens of
    :data:`CLIP_DIM` (the pipeline takes the penultimate hidden states)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    return CLIPVisionModel(CLIPVisionConfig(
        hidden_size=CLIP_DIM, intermediate_size=2 * CLIP_DIM, num_hidden_layers=2,
        num_attention_heads=2, image_size=32, patch_size=8, projection_dim=CLIP_DIM,
    )).eval()


def tiny_clip_image_processor():
    """CLIP's preprocessing (bicubic resize of the short side, center crop, CLIP's mean and
    std) at 32 pixels."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def _pipeline(seed: int, shift: float, vae, transformer, **parts):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    return WanImageToVideoPipeline(
        tokenizer=tiny_clip_tokenizer(),
        text_encoder=tiny_t5_encoder(32, seed, umt5=True),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=transformer,
        **parts,
    )


def tiny_wan_i2v_pipeline(seed: int = 0, shift: float = 3.0):
    """A random Wan2.1 I2V-like ``WanImageToVideoPipeline`` (CLIP image embeddings; the
    transformer's attention assumes 512 text tokens)."""
    return _pipeline(seed, shift, _wan21_vae(seed), _transformer(seed, 36, 16, image=True),
                     image_encoder=tiny_clip_vision(seed),
                     image_processor=tiny_clip_image_processor())


def tiny_wan22_i2v_a14b_pipeline(seed: int = 0, shift: float = 3.0,
                                 boundary_ratio: float | None = 0.9):
    """A random Wan2.2 I2V-A14B-like pipeline: ``transformer`` for timesteps at or above
    ``boundary_ratio * 1000``, ``transformer_2`` below; no image encoder. With shift 3 and 5
    steps the sigmas are 1, .923, .818, .667, .429: two high-noise steps, three low-noise ones."""
    return _pipeline(seed, shift, _wan21_vae(seed), _transformer(seed, 36, 16),
                     transformer_2=_transformer(seed + 1, 36, 16), boundary_ratio=boundary_ratio)


def tiny_wan22_ti2v_i2v_pipeline(seed: int = 0, shift: float = 5.0):
    """A random Wan2.2 TI2V-5B-like ``WanImageToVideoPipeline`` (``expand_timesteps``): the
    first latent frame is the image's, at timestep 0."""
    return _pipeline(seed, shift, tiny_wan22_vae(seed), _transformer(seed, WAN22_Z, WAN22_Z),
                     expand_timesteps=True)


WAN_I2V = dict(height=16, width=16, num_frames=5, max_sequence_length=512, image=FIRST_FRAME)
"""Adapter options of the tiny Wan2.1 I2V case (every sample animates :data:`FIRST_FRAME`)."""


def _call(options: dict) -> dict:
    """The pipeline ``__call__`` arguments matching adapter ``options``: the image loaded."""
    from diffusers.utils import load_image

    return {**options, "image": load_image(options["image"])}


WAN_I2V_CALL = _call(WAN_I2V)
"""The matching ``WanImageToVideoPipeline.__call__`` arguments."""
