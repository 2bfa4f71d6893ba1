"""A tiny ``ZImagePipeline`` built in code: the base model's scheduler (resolution-dependent
shift) or Z-Image-Turbo's (static shift 3), for the ``z_image`` family tests."""

from __future__ import annotations

import torch

from helpers.tiny import tiny_vae
from helpers.tiny_families import tiny_char_fast_tokenizer

# Qwen3's chat template reduced to what ZImagePipeline asks of it (one user turn, the generation
# prompt; `enable_thinking=False` would add an empty think block, the pipeline passes True).
QWEN3_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)

Z_IMAGE = dict(height=16, width=16, max_sequence_length=64)
"""The adapter options (and pipeline arguments) of the tiny model: 16x16 images -> latents
``[4, 8, 8]`` -> 16 image tokens; prompts of ~40 characters after the chat template."""


def tiny_z_image_pipeline(seed: int = 0, turbo: bool = False):
    """A random ``ZImagePipeline``: 16x16 images, VAE latents ``[4, 8, 8]`` (a 2-block
    ``AutoencoderKL``, scale 2), a 1+1+2-layer ``ZImageTransformer2DModel`` (dim 16, 2 heads),
    and a 2-layer ``Qwen3Model`` text encoder over a character tokenizer with a chat template.

    ``turbo=False``: a scheduler with the resolution-dependent shift (``use_dynamic_shifting``,
    scaled to the tiny token counts), so the pipeline's ``mu`` is exercised. ``turbo=True``:
    Z-Image-Turbo's scheduler config (static ``shift`` 3.0, no dynamic shifting; the pipeline's
    ``mu`` is then ignored), run with few steps and no CFG."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=16, n_layers=2,
        n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=32, axes_dims=[4, 2, 2],
        axes_lens=[256, 32, 32],
    ).eval()
    torch.manual_seed(seed)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=260, max_position_embeddings=512,
    )).eval()
    tokenizer = tiny_char_fast_tokenizer()
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    if turbo:
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                    use_dynamic_shifting=False)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(
            shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
            base_image_seq_len=4, max_image_seq_len=64,
        )
    return ZImagePipeline(scheduler=scheduler, vae=tiny_vae(seed, latent_channels=4),
                          text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
