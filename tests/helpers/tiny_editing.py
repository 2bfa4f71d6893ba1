"""Tiny image-editing pipelines built in code (no hub, no download), for tests.

- :func:`tiny_flux_kontext_pipeline`: a ``FluxKontextPipeline`` on the tiny FLUX components of
  ``tests/helpers/tiny_families.py`` (16x16 images, 8x8x4 VAE latents, 16 tokens of 16 channels).
- :func:`tiny_flux2_klein_pipeline`: a ``Flux2KleinPipeline``: a 3-layer Qwen3 over a character
  tokenizer with a chat template, a 4-level ``AutoencoderKLFlux2`` (8x downsampling, 4 latent
  channels, so 64x64 images -> 8x8x4 latents -> 16 tokens of 16 channels) whose batch-norm
  statistics are drawn at random (so the normalisation is exercised), and a
  ``Flux2Transformer2DModel`` with one block of each kind.

Each builder seeds torch before every component, so two calls with the same ``seed`` give
pipelines with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers.tiny_families import tiny_char_fast_tokenizer, tiny_flux_pipeline

# A minimal chat template: the klein pipeline renders every prompt as one user turn with
# ``add_generation_prompt=True`` (and ``enable_thinking=False``, unused here).
CHAT_TEMPLATE = (
    "{% for message in messages %}<u>{{ message['content'] }}</u>{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)

KLEIN_LAYERS = (1, 2, 3)  # hidden states stacked into the prompt embedding (hub: 9, 18, 27)


def tiny_flux_kontext_pipeline(seed: int = 0, guidance_embeds: bool = True,
                               dynamic_shift: bool = True):
    """A random ``FluxKontextPipeline`` with the components of ``tiny_flux_pipeline``."""
    from diffusers import FluxKontextPipeline

    flux = tiny_flux_pipeline(seed, guidance_embeds=guidance_embeds, dynamic_shift=dynamic_shift)
    return FluxKontextPipeline(
        scheduler=flux.scheduler, vae=flux.vae, text_encoder=flux.text_encoder,
        tokenizer=flux.tokenizer, text_encoder_2=flux.text_encoder_2,
        tokenizer_2=flux.tokenizer_2, transformer=flux.transformer,
        image_encoder=None, feature_extractor=None,
    )


def tiny_klein_tokenizer():
    """The character tokenizer with :data:`CHAT_TEMPLATE` (pads with id 0, on the right)."""
    tokenizer = tiny_char_fast_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_flux2_klein_pipeline(seed: int = 0, is_distilled: bool = False):
    """A random ``Flux2KleinPipeline`` (64x64 images; references must be >= 64 px).

    ``is_distilled=False`` is a base model (CFG against the empty prompt); True mirrors the
    step-distilled klein checkpoints (the pipeline ignores ``guidance_scale``).
    """
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden = 16
    torch.manual_seed(seed)
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=260,
        max_position_embeddings=256, tie_word_embeddings=True,
    )).eval()
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=hidden * len(KLEIN_LAYERS),
        timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    ).eval()
    torch.manual_seed(seed)
    vae = AutoencoderKLFlux2(
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=4,
        norm_num_groups=4, sample_size=64, mid_block_add_attention=False,
    ).eval()
    g = torch.Generator().manual_seed(seed)
    vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=g) * 0.3)
    vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape, generator=g) + 0.5)
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential",
    )
    return Flux2KleinPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder,
        tokenizer=tiny_klein_tokenizer(), transformer=transformer, is_distilled=is_distilled,
    )

