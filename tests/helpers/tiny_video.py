"""Tiny Wan2.2 (TI2V-5B-like and A14B-like), HunyuanVideo and Qwen-Image pipelines built in code
(no hub, no download), for tests.

Each builder seeds torch before every component, so two calls with the same ``seed`` give pipelines
with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_tokenizer
from helpers.tiny_families import tiny_char_fast_tokenizer, tiny_t5_encoder

WAN22_Z = 8
"""Latent channels of the tiny Wan2.2 VAE (the real one has 48)."""


def _wan_transformer(seed: int, channels: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=channels, out_channels=channels, text_dim=32, freq_dim=256, ffn_dim=32,
        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()


def tiny_wan22_vae(seed: int = 0):
    """A random Wan2.2 residual VAE: 2x2 pixel patching (12 input channels) before 8x spatial
    and 4x temporal downsampling (16x spatial overall), ``WAN22_Z`` latent channels, a decoder
    wider than the encoder (``decoder_base_dim``), as the TI2V-5B VAE."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=4, decoder_base_dim=8, z_dim=WAN22_Z, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
        out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[0.1 * i - 0.3 for i in range(WAN22_Z)],
        latents_std=[0.5 + 0.1 * i for i in range(WAN22_Z)],
    ).eval()


def tiny_wan22_ti2v_pipeline(seed: int = 0, shift: float = 5.0):
    """A random Wan2.2 TI2V-like ``WanPipeline`` (``expand_timesteps=True``, per-token
    timesteps): 5 frames of 32x64 -> latents ``[8, 2, 2, 4]``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    return WanPipeline(
        tokenizer=tiny_clip_tokenizer(),
        text_encoder=tiny_t5_encoder(32, seed, umt5=True),
        vae=tiny_wan22_vae(seed),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=_wan_transformer(seed, WAN22_Z),
        expand_timesteps=True,
    )


def tiny_wan22_a14b_pipeline(seed: int = 0, shift: float = 3.0, boundary_ratio: float = 0.875):
    """A random Wan2.2 A14B-like ``WanPipeline``: two experts (``transformer`` for timesteps at
    or above ``boundary_ratio * 1000``, ``transformer_2`` below) over the Wan2.1 VAE; 5 frames of
    16x16 -> latents ``[16, 2, 2, 2]``. With shift 3 and 5 steps the sigmas are 1, .923, .818,
    .667, .429: the first two steps run the high-noise expert, the last three the low-noise one.
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    return WanPipeline(
        tokenizer=tiny_clip_tokenizer(),
        text_encoder=tiny_t5_encoder(32, seed, umt5=True),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=_wan_transformer(seed, 16),
        transformer_2=_wan_transformer(seed + 1, 16),
        boundary_ratio=boundary_ratio,
    )


HUNYUAN_TEMPLATE = {"template": "Describe the video: {}", "crop_start": 20}
"""A prompt template for the character tokenizer: ``crop_start`` = the 20 characters (tokens)
before ``{}``, which the pipeline drops from the Llama embeddings."""


def tiny_hunyuan_video_pipeline(seed: int = 0, shift: float = 7.0, guidance_embeds: bool = True):
    """A random ``HunyuanVideoPipeline``: 5 frames of 16x16 -> latents ``[4, 2, 2, 2]``.

    Text: a 2-layer ``LlamaModel`` (the pipeline takes the hidden state 3 from the end, so it
    needs 2 layers) over a character tokenizer, and a ``CLIPTextModel`` with 77 positions (the
    pipeline pads CLIP prompts to 77 tokens) over the character CLIP tokenizer.
    """
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1,
        guidance_embeds=guidance_embeds, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(2, 2, 4),
    ).eval()
    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True,
    ).eval()
    torch.manual_seed(seed)
    llama = LlamaModel(LlamaConfig(
        vocab_size=260, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0,
    )).eval()
    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=200, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=8,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )).eval()
    return HunyuanVideoPipeline(
        text_encoder=llama,
        tokenizer=tiny_char_fast_tokenizer(),
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        text_encoder_2=clip,
        tokenizer_2=tiny_clip_tokenizer(77),
    )


def tiny_qwen_image_pipeline(seed: int = 0, shift_terminal: float | None = 0.02):
    """A random ``QwenImagePipeline``: 32x32 images -> VAE latents ``[4, 1, 4, 4]`` packed into 4
    tokens of 16. Text: a 2-layer Qwen2.5-VL (a 1-block vision tower that text prompts never
    reach) over a character tokenizer; the pipeline drops the template's first 34 tokens.

    The scheduler is configured like Qwen-Image's (dynamic exponential shift, stretched to end at
    ``shift_terminal``), scaled to the tiny token counts. With ``shift_terminal`` the pipeline
    cannot run 1 step (its stretch divides by zero); ``None`` allows it."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(2, 2, 4),
    ).eval()
    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(
        base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.0, 0.3], latents_std=[0.8, 1.2, 1.0, 0.9],
    ).eval()
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=260, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=16, fullatt_block_indexes=[0]),
        image_token_id=255, video_token_id=256, vision_start_token_id=257,
        vision_end_token_id=258,
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=4, max_image_seq_len=64, shift_terminal=shift_terminal,
        time_shift_type="exponential",
    )
    return QwenImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder,
        tokenizer=tiny_char_fast_tokenizer(), transformer=transformer,
    )
