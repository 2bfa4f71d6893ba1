"""Tiny FLUX, Wan and ACE-Step pipelines built in code (no hub, no download), for tests.

Each builder seeds torch before every component, so two calls with the same ``seed`` give pipelines
with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers.tiny import tiny_clip_tokenizer, tiny_vae


def tiny_clip_text_model(hidden: int = 32, seed: int = 0):
    """A 1-layer ``CLIPTextModel`` (FLUX uses its pooled output) over the char tokenizer's ids."""
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=200, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32, projection_dim=hidden,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return CLIPTextModel(config).eval()


def tiny_t5_encoder(d_model: int = 32, seed: int = 0, umt5: bool = False):
    """A 1-layer T5 (or UMT5, as Wan ships) encoder over the char tokenizer's 200 ids."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    kwargs = dict(vocab_size=200, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=1,
                  num_heads=2, relative_attention_num_buckets=8, pad_token_id=1, eos_token_id=1)
    if umt5:
        return UMT5EncoderModel(UMT5Config(**kwargs)).eval()
    return T5EncoderModel(T5Config(**kwargs)).eval()


def tiny_flux_pipeline(seed: int = 0, guidance_embeds: bool = True, dynamic_shift: bool = True):
    """A random ``FluxPipeline``: 16x16 images, 8x8x4 VAE latents packed into 16 tokens of 16.

    The scheduler uses FLUX.1's resolution-dependent shift (``use_dynamic_shifting``), so the
    ``mu``-from-sequence-length path is exercised; ``guidance_embeds`` mirrors dev (True) or
    schnell (False).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=guidance_embeds, axes_dims_rope=(4, 4, 8),
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=dynamic_shift, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=4, max_image_seq_len=64,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=tiny_vae(seed, latent_channels=4),
        text_encoder=tiny_clip_text_model(32, seed),
        tokenizer=tiny_clip_tokenizer(),
        text_encoder_2=tiny_t5_encoder(32, seed + 1),
        tokenizer_2=tiny_clip_tokenizer(),
        transformer=transformer,
        image_encoder=None,
        feature_extractor=None,
    )


def tiny_wan_pipeline(seed: int = 0, shift: float = 3.0):
    """A random ``WanPipeline``: 5 frames of 16x16 -> latents ``[16, 2, 2, 2]``."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    return WanPipeline(
        tokenizer=tiny_clip_tokenizer(),
        text_encoder=tiny_t5_encoder(32, seed, umt5=True),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=transformer,
    )


def tiny_char_fast_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` built offline (0 pad, 1 unk, 2.. chars)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1}
    vocab.update({chr(i): i + 2 for i in range(256)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


def tiny_ace_step_pipeline(seed: int = 0, is_turbo: bool = False):
    """A random ``AceStepPipeline``: stereo 8 Hz "audio", 4 latent frames per second, 8 channels.

    ``is_turbo=False`` is the base/SFT variant whose guidance uses the learned null condition.
    """
    from diffusers import AceStepPipeline, AutoencoderOobleck, FlowMatchEulerDiscreteScheduler
    from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
    from diffusers.pipelines.ace_step import AceStepConditionEncoder
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    transformer = AceStepTransformer1DModel(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8,
        patch_size=2, rope_theta=10000.0, sliding_window=16, is_turbo=is_turbo,
    ).eval()
    torch.manual_seed(seed)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=260, max_position_embeddings=512,
    )).eval()
    torch.manual_seed(seed)
    condition_encoder = AceStepConditionEncoder(
        hidden_size=32, intermediate_size=64, text_hidden_dim=32, timbre_hidden_dim=8,
        num_lyric_encoder_hidden_layers=1, num_timbre_encoder_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
        sliding_window=16,
    ).eval()
    # A non-zero "silence" so the source-latent conditioning is exercised (real ones are VAE codes).
    condition_encoder.silence_latent.normal_(generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    vae = AutoencoderOobleck(
        encoder_hidden_size=6, downsampling_ratios=[1, 2], decoder_channels=3,
        decoder_input_channels=8, audio_channels=2, channel_multiples=[2, 4], sampling_rate=8,
    ).eval()
    return AceStepPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_char_fast_tokenizer(),
        transformer=transformer,
        condition_encoder=condition_encoder,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0),
    )


def tiny_longcat_tts_pipeline(seed: int = 0):
    """A random ``LongCatAudioDiTPipeline``: 1 kHz mono "speech", 8x VAE downsampling (125
    latent frames per second) of 8 channels, a 2-block DiT over a 1-layer UMT5.

    The DiT zero-initialises its output projections (a new model predicts 0); they are drawn at
    random here so that rollouts move and LoRA changes show."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        LongCatAudioDiTPipeline,
        LongCatAudioDiTTransformer,
        LongCatAudioDiTVae,
    )

    torch.manual_seed(seed)
    transformer = LongCatAudioDiTTransformer(
        dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=32, latent_dim=8, ff_mult=2.0,
    ).eval()
    with torch.no_grad():
        for module in (transformer.proj_out, transformer.norm_out.linear,
                       transformer.adaln_global_mlp.mlp[-1]):
            module.weight.normal_(0.0, 0.2)
            module.bias.normal_(0.0, 0.1)
    torch.manual_seed(seed)
    vae = LongCatAudioDiTVae(
        channels=4, c_mults=[1, 2, 4], strides=[2, 2, 2], latent_dim=8, encoder_latent_dim=16,
        downsampling_ratio=8, sample_rate=1000,
    ).eval()
    return LongCatAudioDiTPipeline(
        vae=vae,
        text_encoder=tiny_t5_encoder(32, seed, umt5=True),
        tokenizer=tiny_clip_tokenizer(),
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, invert_sigmas=True),
    )
