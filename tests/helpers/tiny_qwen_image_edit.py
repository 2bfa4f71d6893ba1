"""Tiny Qwen-Image-Edit pipelines built in code (no hub, no download), for tests.

- :func:`tiny_qwen_image_edit_pipeline`: a ``QwenImageEditPipeline`` (or, with ``plus=True``,
  a ``QwenImageEditPlusPipeline``) on the tiny Qwen-Image transformer and VAE of
  ``tests/helpers/tiny_video.py`` (32x32 images -> 4 tokens of 16 channels), with a 2-layer
  Qwen2.5-VL whose 1-block vision tower sees the reference: a character tokenizer that knows
  Qwen's vision tokens, and a ``Qwen2VLProcessor`` whose image processor caps the vision input
  at 112 x 112 pixels (16 patches of 14, merged 2x2 into 4 tokens), so even the pipeline's
  default ~1 MP reference costs the text encoder only a few tokens.

Each builder seeds torch before every component, so two calls with the same ``seed`` give
pipelines with identical weights (the LoRA round-trip tests load a saved adapter into such a twin).
"""

from __future__ import annotations

import torch

from helpers import ROOT

SOURCE = str(ROOT / "configs" / "prompts" / "text_edits" / "sign_0.png")
"""A shipped source image (the edit recipes' example prompt set), the tiny case's default
``image``."""

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen2.5-VL's vision tokens, ids 258..261 after the character vocabulary."""

VISION_MAX_PIXELS = 112 * 112
"""The tiny processor's cap on a vision input (the hub processor's is 12845056)."""


def tiny_vl_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (0 pad, 1 unk, 2.. chars) whose vision
    tokens (:data:`VISION_TOKENS`) are single special tokens, as in Qwen's tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1}
    vocab.update({chr(i): i + 2 for i in range(256)})
    vocab.update({t: 258 + i for i, t in enumerate(VISION_TOKENS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=list(VISION_TOKENS))


def tiny_vl_processor():
    """A ``Qwen2VLProcessor``: Qwen2-VL's image processing (14-pixel patches, 2x2 merge,
    temporal patch 2) capped at :data:`VISION_MAX_PIXELS`, over :func:`tiny_vl_tokenizer`."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": 28 * 28, "longest_edge": VISION_MAX_PIXELS}
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(size=size),
                            tokenizer=tiny_vl_tokenizer(),
                            video_processor=Qwen2VLVideoProcessor(size=size))


def tiny_vl_encoder(seed: int = 0):
    """A 2-layer Qwen2.5-VL (hidden 16) with a 1-block vision tower (14-pixel patches)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=262, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=16, fullatt_block_indexes=[0], patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        vision_start_token_id=258, vision_end_token_id=259, image_token_id=260,
        video_token_id=261,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def tiny_qwen_image_edit_pipeline(seed: int = 0, plus: bool = False,
                                  shift_terminal: float | None = 0.02, zero_cond_t: bool = False):
    """A random ``QwenImageEditPipeline`` (``plus``: ``QwenImageEditPlusPipeline``).

    The transformer and VAE are the tiny Qwen-Image's (``tiny_qwen_image_pipeline``), the
    scheduler configured like Qwen-Image-Edit's (dynamic exponential shift stretched to
    ``shift_terminal``) at tiny token counts. ``zero_cond_t`` mirrors Qwen-Image-Edit-2511's
    transformer (the reference tokens are modulated at timestep 0)."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImageEditPlusPipeline,
        QwenImageTransformer2DModel,
    )

    from helpers.tiny_video import tiny_qwen_image_pipeline

    base = tiny_qwen_image_pipeline(seed)
    transformer = base.transformer
    if zero_cond_t:
        torch.manual_seed(seed)
        transformer = QwenImageTransformer2DModel(
            **{**transformer.config, "zero_cond_t": True}).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=4, max_image_seq_len=64, shift_terminal=shift_terminal,
        time_shift_type="exponential",
    )
    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return cls(scheduler=scheduler, vae=base.vae, text_encoder=tiny_vl_encoder(seed),
               tokenizer=tiny_vl_tokenizer(), processor=tiny_vl_processor(),
               transformer=transformer)


QWEN_EDIT = dict(height=32, width=32, reference_area=64 * 64, image=SOURCE)
"""Adapter options of the tiny ``qwen_image_edit`` case: 32x32 edits of :data:`SOURCE` at a
64 x 64 reference (4 reference tokens instead of the default area's 4096)."""

QWEN_EDIT_PLUS = dict(QWEN_EDIT, condition_area=64 * 64)
"""The same for ``qwen_image_edit_plus`` (its text-encoder input at 64 x 64 too)."""
