"""A tiny LTX-Video ``LTXPipeline`` built in code (no hub, no download), for tests.

The builder seeds torch before every component, so two calls with the same ``seed`` give
pipelines with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_tokenizer
from helpers.tiny_families import tiny_t5_encoder

LTX_Z = 8
"""Latent channels of the tiny LTX VAE (the real one has 128)."""


def tiny_ltx_vae(seed: int = 0, timestep_conditioning: bool = True):
    """A random LTX-Video VAE: 4x4 pixel patching, then two spatio-temporal 2x downsamplings:
    16x spatial and 4x temporal compression (the real VAE: 32x and 8x), ``LTX_Z`` channels.
    ``timestep_conditioning`` is the decoder option of LTX-Video 0.9.1 and later."""
    from diffusers import AutoencoderKLLTXVideo

    torch.manual_seed(seed)
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=LTX_Z, block_out_channels=(8, 8),
        down_block_types=("LTXVideoDownBlock3D", "LTXVideoDownBlock3D"),
        decoder_block_out_channels=(8, 8), layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, True),
        decoder_spatio_temporal_scaling=(True, True), decoder_inject_noise=(False, False, False),
        upsample_residual=(False, False), upsample_factor=(1, 1),
        timestep_conditioning=timestep_conditioning, patch_size=4, patch_size_t=1,
        encoder_causal=True, decoder_causal=False,
    ).eval()
    with torch.no_grad():  # non-trivial latent statistics, so un-normalising is exercised
        vae.latents_mean.copy_(torch.linspace(-0.3, 0.3, LTX_Z))
        vae.latents_std.copy_(torch.linspace(0.6, 1.4, LTX_Z))
    return vae


def tiny_ltx_pipeline(seed: int = 0, timestep_conditioning: bool = True):
    """A random ``LTXPipeline``: 5 frames of 32x64 -> latents ``[8, 2, 2, 4]`` packed into 16
    tokens of 8 (the transformer's patch size is 1, as LTX-Video's).

    The scheduler is configured like LTX-Video's (dynamic exponential shift from the latent
    sequence length, stretched to end at ``shift_terminal``), scaled to the tiny token counts.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXPipeline, LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(
        in_channels=LTX_Z, out_channels=LTX_Z, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=12, cross_attention_dim=24, num_layers=2,
        caption_channels=32,
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=8, max_image_seq_len=64, shift_terminal=0.1,
        time_shift_type="exponential",
    )
    return LTXPipeline(
        scheduler=scheduler, vae=tiny_ltx_vae(seed, timestep_conditioning),
        text_encoder=tiny_t5_encoder(32, seed), tokenizer=tiny_clip_tokenizer(),
        transformer=transformer,
    )
