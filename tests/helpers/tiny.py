"""Tiny diffusers pipelines built in code (no hub, milliseconds to build) for tests."""

from __future__ import annotations

import torch


def tiny_clip_tokenizer(max_length: int = 16):
    """A character-level CLIP tokenizer built offline (printable ASCII, word-final variants)."""
    from transformers import CLIPTokenizer

    chars = [chr(c) for c in range(33, 127)]
    tokens = ["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars]
    vocab = {t: i for i, t in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def tiny_clip_text_encoder(hidden: int = 16, projection: int = 16, seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=200, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32, projection_dim=projection,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return CLIPTextModelWithProjection(config).eval()


def tiny_vae(seed: int = 0, latent_channels: int = 4):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=4,
        sample_size=16, scaling_factor=1.5, shift_factor=0.1,
    ).eval()


def tiny_sd3_pipeline(seed: int = 0, shift: float = 3.0):
    """A random ``StableDiffusion3Pipeline``: 16x16 images, 8x8x4 latents, no T5 encoder."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=32, out_channels=4, pos_embed_max_size=16,
    ).eval()
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        vae=tiny_vae(seed),
        text_encoder=tiny_clip_text_encoder(16, 16, seed),
        tokenizer=tiny_clip_tokenizer(),
        text_encoder_2=tiny_clip_text_encoder(16, 16, seed + 1),
        tokenizer_2=tiny_clip_tokenizer(),
        text_encoder_3=None,
        tokenizer_3=None,
    )
