"""A tiny LTX-2 ``LTX2Pipeline`` built in code (no hub, no download), for tests.

The builder seeds torch before every component, so two calls with the same ``seed`` give
pipelines with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_tokenizer

LTX2_Z = 4
"""Latent channels of the tiny LTX-2 video VAE (the real one has 128)."""

GEMMA_HIDDEN, GEMMA_LAYERS = 16, 1


def tiny_gemma3_encoder(seed: int = 0):
    """A 1-layer ``Gemma3ForConditionalGeneration`` (a tiny SigLIP tower beside it, never used
    for text) over the char tokenizer's 200 ids: LTX-2's text encoder, whose every hidden state
    the pipeline stacks (``GEMMA_LAYERS + 1`` of ``GEMMA_HIDDEN``)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    config = Gemma3Config(
        text_config=dict(vocab_size=200, hidden_size=GEMMA_HIDDEN, intermediate_size=32,
                         num_hidden_layers=GEMMA_LAYERS, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                         sliding_window=16, pad_token_id=1, eos_token_id=1, bos_token_id=0),
        vision_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                           num_attention_heads=1, image_size=8, patch_size=4),
        mm_tokens_per_image=4, image_token_index=199, boi_token_index=197, eoi_token_index=198,
    )
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_ltx2_video_vae(seed: int = 0, timestep_conditioning: bool = True):
    """A random LTX-2 video VAE: 4x4 pixel patching and one spatio-temporal 2x downsampling
    (8x spatial, 2x temporal; the real VAE: 32x and 8x), ``LTX2_Z`` channels, with non-trivial
    latent statistics so un-normalising is exercised."""
    from diffusers import AutoencoderKLLTX2Video

    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=LTX2_Z, block_out_channels=(8,),
        decoder_block_out_channels=(8,), layers_per_block=(1,), decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatiotemporal",),
        upsample_residual=(False,), upsample_factor=(1,),
        timestep_conditioning=timestep_conditioning, patch_size=4, patch_size_t=1,
        encoder_causal=True, decoder_causal=False,
    ).eval()
    with torch.no_grad():
        vae.latents_mean.copy_(torch.linspace(-0.3, 0.3, LTX2_Z))
        vae.latents_std.copy_(torch.linspace(0.6, 1.4, LTX2_Z))
    return vae


def tiny_ltx2_audio_vae(seed: int = 0):
    """A random LTX-2 audio VAE over 8 mel bins (latents ``[2, L, 2]``: 2 channels, 4x mel
    compression), 16 kHz with a 160-sample hop: 25 latent frames per second."""
    from diffusers import AutoencoderKLLTX2Audio

    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None,
        in_channels=2, resolution=32, latent_channels=2, norm_type="pixel",
        causality_axis="height", dropout=0.0, mid_block_add_attention=False, sample_rate=16000,
        mel_hop_length=160, is_causal=True, mel_bins=8,
    ).eval()
    with torch.no_grad():  # per-feature statistics of the packed audio tokens (2 ch x 2 bins)
        vae.latents_mean.copy_(torch.linspace(-0.2, 0.2, vae.latents_mean.numel()))
        vae.latents_std.copy_(torch.linspace(0.7, 1.3, vae.latents_std.numel()))
    return vae


def tiny_ltx2_pipeline(seed: int = 0, timestep_conditioning: bool = True):
    """A random ``LTX2Pipeline``: 5 frames of 32x32 -> video latents ``[4, 3, 4, 4]`` (48 tokens
    of 4) and, at 25 fps, 0.2 s of audio -> audio latents ``[2, 5, 2]`` (5 tokens of 4).

    The scheduler is configured like LTX-2's (dynamic exponential shift from the video token
    count, stretched to end at ``shift_terminal``), scaled to the tiny token counts.
    """
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    text_encoder = tiny_gemma3_encoder(seed)
    torch.manual_seed(seed)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=LTX2_Z, out_channels=LTX2_Z, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
        qk_norm="rms_norm_across_heads", caption_channels=GEMMA_HIDDEN,
        rope_double_precision=False, rope_type="split", perturbed_attn=True,  # STG can act
    ).eval()
    torch.manual_seed(seed)
    connectors = LTX2TextConnectors(
        caption_channels=GEMMA_HIDDEN, text_proj_in_factor=GEMMA_LAYERS + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=8,
        video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
        causal_temporal_positioning=False, rope_type="split",
    ).eval()
    audio_vae = tiny_ltx2_audio_vae(seed)
    torch.manual_seed(seed)
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=16, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=8, max_image_seq_len=64, shift_terminal=0.1,
        time_shift_type="exponential",
    )
    return LTX2Pipeline(
        scheduler=scheduler, vae=tiny_ltx2_video_vae(seed, timestep_conditioning),
        audio_vae=audio_vae, text_encoder=text_encoder, tokenizer=tiny_clip_tokenizer(),
        connectors=connectors, transformer=transformer, vocoder=vocoder,
    )


LTX2_SIZE = dict(height=32, width=32, num_frames=5, frame_rate=25.0, max_sequence_length=16)
"""The tiny pipeline's adapter options (and the matching pipeline arguments)."""

LTX2_CALL = dict(LTX2_SIZE, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
                 audio_modality_scale=1.0)
"""Pipeline arguments matching the adapter's defaults: the pipeline's defaults turn
spatio-temporal and modality guidance on, the adapter's leave them off."""
