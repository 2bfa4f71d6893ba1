"""PickScore (Kirstain et al. 2023): a CLIP-H model fine-tuned on human preferences (Pick-a-Pic).

``score = logit_scale.exp() * cos(image, prompt)``, the number papers report (about 18-23 for
SD-class images; ``logit_scale.exp()`` is 100 for the released model). Flow-GRPO trains on
``score / 26`` so that rewards sit near [0, 1]; ``normalize=True`` does the same. Group-relative
advantages are invariant to this scale; it only changes the logged values.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import RewardOutput, register
from .clip import cosine_scores, hf_text_features, pick_device, pooled
from .media import Media, check_batch, require

PICKSCORE_NORMALIZER = 26.0


class HFClipEncoder:
    """A transformers ``CLIPModel`` plus ``CLIPProcessor``, embedding in batches.

    Args:
        model: hub id or local folder for ``CLIPModel.from_pretrained``, or a built ``CLIPModel``.
        processor: hub id or local folder for ``CLIPProcessor.from_pretrained``, or a built
            processor (anything with ``.tokenizer`` and ``.image_processor``); default ``model``.
        device: where the model runs; default CUDA when available.
        batch_size: images or texts per forward pass.
        dtype: model weights dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).

    Images go through the processor's image processor as tensors (transformers 5 runs it with
    torch ops: shortest-edge resize, center crop, normalize) with ``do_rescale=False`` because the
    media is already in [0, 1].
    """

    def __init__(
        self,
        model: Any,
        processor: Any = None,
        device: str | torch.device | None = None,
        batch_size: int = 16,
        dtype: str = "float32",
    ) -> None:
        from transformers import CLIPModel, CLIPProcessor

        self.device = pick_device(device)
        self.batch_size = int(batch_size)
        processor = model if processor is None else processor
        if isinstance(processor, str):
            processor = CLIPProcessor.from_pretrained(processor)
        self.tokenizer, self.image_processor = processor.tokenizer, processor.image_processor
        if isinstance(model, str):
            model = CLIPModel.from_pretrained(model, dtype=getattr(torch, dtype))
        self.model = model.eval().to(self.device)
        self.dtype = next(self.model.parameters()).dtype
        self.max_length = int(self.model.config.text_config.max_position_embeddings)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 3, H, W]`` in [0, 1] -> L2-normalized embeddings ``[N, D]`` float32."""
        out = []
        for chunk in images.split(self.batch_size):
            pixels = self.image_processor(
                images=chunk.float().to(self.device), do_rescale=False, return_tensors="pt",
                device=self.device,
            )["pixel_values"]
            feats = self.model.get_image_features(pixel_values=pixels.to(self.device, self.dtype))
            out.append(pooled(feats).float())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """``N`` strings -> L2-normalized embeddings ``[N, D]`` float32 (truncated to the model)."""
        return hf_text_features(self.model, self.tokenizer, texts, self.batch_size,
                                self.max_length, self.device)

    def logit_scale(self) -> float:
        """The model's learned temperature, ``exp(logit_scale)``."""
        return float(self.model.logit_scale.detach().float().exp())


@register("pickscore")
class PickScore:
    """PickScore reward.

    Args:
        model: ``CLIPModel`` hub id / local folder / instance (default the released PickScore_v1).
        processor: ``CLIPProcessor`` hub id / local folder / instance (default the CLIP-H processor
            PickScore was trained with).
        device, batch_size, dtype: see :class:`HFClipEncoder`.
        normalize: divide by 26 as Flow-GRPO does (scores near [0, 1]); default off.

    Returns ``scores[B] = exp(logit_scale) * cos`` (``/ 26`` if ``normalize``); video frames
    averaged.
    """

    def __init__(
        self,
        model: Any = "yuvalkirstain/PickScore_v1",
        processor: Any = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        device: str | None = None,
        batch_size: int = 16,
        dtype: str = "float32",
        normalize: bool = False,
    ) -> None:
        self.encoder = HFClipEncoder(model, processor, device, batch_size, dtype)
        self.factor = self.encoder.logit_scale() / (PICKSCORE_NORMALIZER if normalize else 1.0)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", "video", reward="pickscore")
        check_batch(media, prompts, metadata, reward="pickscore")
        cos = cosine_scores(self.encoder, media, prompts)
        scores = (self.factor * cos).float()
        return RewardOutput(scores=scores, info={"cos_mean": float(cos.mean())})
