"""A tiny ``AmusedPipeline`` built in code (random weights, no hub), for tests."""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_text_encoder, tiny_clip_tokenizer
from helpers.tiny_vq_diffusion import tiny_vq_model

CODES = 15  # codebook entries the transformer predicts
VOCAB = 24  # its input vocabulary: the codes, unused ids 15..22 and the mask (23), as aMUSEd's
# 8192 codes sit in a vocabulary of 8256 with the mask last
SIDE = 4  # the token grid (16 tokens); three VQ blocks decode it to 16x16 images


def tiny_amused_pipeline(seed: int = 0, masking_schedule: str = "cosine"):
    """A random ``AmusedPipeline``: a 1-layer ``UVit2DModel`` over a 4x4 grid of 15 codes, a
    3-block ``VQModel`` that looks its codes up in the codebook (16x16 images), the tiny CLIP
    text encoder with projection (pooled and hidden states) and an ``AmusedScheduler``."""
    from diffusers import AmusedPipeline, AmusedScheduler, UVit2DModel

    torch.manual_seed(seed)
    transformer = UVit2DModel(
        hidden_size=8, use_bias=True, cond_embed_dim=8, micro_cond_encode_dim=2,
        micro_cond_embed_dim=10, encoder_hidden_size=8, vocab_size=VOCAB, codebook_size=CODES,
        in_channels=8, block_out_channels=8, num_res_blocks=1, block_num_heads=1,
        num_hidden_layers=1, num_attention_heads=1, intermediate_size=8, layer_norm_eps=1e-12,
        sample_size=SIDE,
    ).eval()
    vqvae = tiny_vq_model(CODES, seed, lookup_from_codebook=True, force_upcast=False)
    return AmusedPipeline(
        vqvae=vqvae, tokenizer=tiny_clip_tokenizer(),
        text_encoder=tiny_clip_text_encoder(hidden=8, projection=8, seed=seed),
        transformer=transformer,
        scheduler=AmusedScheduler(mask_token_id=VOCAB - 1, masking_schedule=masking_schedule),
    )
