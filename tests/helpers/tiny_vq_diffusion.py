"""A tiny ``VQDiffusionPipeline`` built in code (random weights, no hub), for tests."""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_tokenizer
from helpers.tiny_families import tiny_clip_text_model

CODES = 15  # codebook entries; the transformer's vocabulary adds the mask (16 states)
SIDE = 4  # the token grid (16 tokens); three VQ blocks decode it to 16x16 images
TRAIN_STEPS = 100  # VQ-Diffusion ITHQ's num_train_timesteps (num_embeds_ada_norm)


def tiny_vq_model(codes: int, seed: int = 0, **options):
    """A 3-block ``VQModel`` with ``codes`` codebook entries of 4 channels: 4x4 codes decode to
    16x16 images."""
    from diffusers import VQModel

    torch.manual_seed(seed)
    return VQModel(
        in_channels=3, out_channels=3, latent_channels=4, num_vq_embeddings=codes, vq_embed_dim=4,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 8), layers_per_block=1, norm_num_groups=4, sample_size=16,
        **options,
    ).eval()


def tiny_vq_diffusion_pipeline(seed: int = 0, learnable: bool = True):
    """A random ``VQDiffusionPipeline``: a 1-layer discrete ``Transformer2DModel`` over a 4x4 grid
    of 15 codes plus the mask, a 3-block ``VQModel`` (16x16 images), the tiny CLIP text model and
    learned classifier-free embeddings (random, so the unconditional branch differs from an
    empty prompt's); ``learnable=False`` encodes the empty prompt instead."""
    from diffusers import Transformer2DModel, VQDiffusionPipeline, VQDiffusionScheduler
    from diffusers.pipelines.deprecated.vq_diffusion.pipeline_vq_diffusion import (
        LearnedClassifierFreeSamplingEmbeddings,
    )

    tokenizer = tiny_clip_tokenizer()
    torch.manual_seed(seed)
    transformer = Transformer2DModel(
        num_attention_heads=2, attention_head_dim=8, num_vector_embeds=CODES + 1,
        sample_size=SIDE, num_layers=1, cross_attention_dim=32, norm_type="ada_norm",
        num_embeds_ada_norm=TRAIN_STEPS, activation_fn="geglu-approximate", attention_bias=True,
    ).eval()
    vqvae = tiny_vq_model(CODES, seed)
    torch.manual_seed(seed + 1)
    embeddings = LearnedClassifierFreeSamplingEmbeddings(
        learnable=learnable, hidden_size=32 if learnable else None,
        length=tokenizer.model_max_length if learnable else None)
    if learnable:
        with torch.no_grad():
            embeddings.embeddings.copy_(torch.randn_like(embeddings.embeddings) * 0.1)
    return VQDiffusionPipeline(
        vqvae=vqvae, text_encoder=tiny_clip_text_model(32, seed), tokenizer=tokenizer,
        transformer=transformer,
        scheduler=VQDiffusionScheduler(num_vec_classes=CODES + 1, num_train_timesteps=TRAIN_STEPS),
        learned_classifier_free_sampling_embeddings=embeddings,
    )
