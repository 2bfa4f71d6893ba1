"""CLIPScore: text-image cosine similarity with an open_clip model.

Hessel et al. 2021 ("CLIPScore") report ``2.5 * max(cos, 0)``. The reward defaults to the raw
cosine (``scale=1, clamp=False``): group-relative advantages are invariant to a positive scale,
and clamping at 0 would erase the ordering among poorly matching samples, which is exactly the
signal early training needs. Set ``scale=2.5, clamp=True`` to reproduce the published number.

Images are preprocessed with torch ops on the batch (no PIL round trip), following the model's own
preprocess config (input size, resize mode, interpolation, mean, std).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import RewardOutput, register
from .media import Media, as_frames, average_frames, check_batch, normalize, require, resize_crop


def pick_device(device: str | torch.device | None) -> torch.device:
    """``device`` or, when ``None``, CUDA if available else CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def unique_prompts(prompts: list[str]) -> tuple[list[str], torch.Tensor]:
    """Distinct prompts (first-seen order) and the index of each prompt among them ``[B]``.

    A group repeats its prompt G times; encoding each text once saves (G-1)/G of the text work.
    """
    order: dict[str, int] = {}
    index = [order.setdefault(p, len(order)) for p in prompts]
    return list(order), torch.tensor(index, dtype=torch.long)


def pooled(output: Any) -> torch.Tensor:
    """Projected features from a transformers ``get_*_features`` call (4.x tensor or 5.x output)."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


@torch.no_grad()
def hf_text_features(model: Any, tokenizer: Any, texts: list[str], batch_size: int,
                     max_length: int, device: torch.device | str) -> torch.Tensor:
    """``N`` strings -> L2-normalized ``get_text_features`` embeddings ``[N, D]`` float32
    of a transformers dual encoder (CLIP, PickScore, CLAP), batched and truncated."""
    out = []
    for i in range(0, len(texts), batch_size):
        tokens = tokenizer(
            texts[i : i + batch_size], padding=True, truncation=True, max_length=max_length,
            return_tensors="pt",
        ).to(device)
        feats = model.get_text_features(
            input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]
        )
        out.append(pooled(feats).float())
    return torch.nn.functional.normalize(torch.cat(out), dim=-1)


class OpenClipEncoder:
    """An open_clip model plus its tokenizer and preprocess config, embedding in batches.

    Args:
        model: an open_clip model name (``"ViT-B-32"``, a config added with
            ``open_clip.add_model_config``, ``"hf-hub:org/repo"``, ``"local-dir:/path"``) or an
            already built open_clip model (``torch.nn.Module`` with ``encode_image/encode_text``).
        pretrained: weights tag (``"openai"``) or a local checkpoint path (safetensors preferred);
            ``None`` keeps the random initialization. Ignored for ``hf-hub:``/``local-dir:`` names.
        device: where the model runs; default CUDA when available.
        batch_size: images or texts per forward pass.
        precision: open_clip precision (``"fp32"``, ``"bf16"``, ``"fp16"``).
        tokenizer: callable ``list[str] -> LongTensor [N, L]``; default the model's tokenizer.
    """

    def __init__(
        self,
        model: str | torch.nn.Module,
        pretrained: str | None = None,
        device: str | torch.device | None = None,
        batch_size: int = 32,
        precision: str = "fp32",
        tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
    ) -> None:
        import open_clip

        self.device = pick_device(device)
        self.batch_size = int(batch_size)
        if isinstance(model, torch.nn.Module):
            self.model = model
            context = int(getattr(model, "context_length", 77))
            self.tokenizer = tokenizer or open_clip.SimpleTokenizer(context_length=context)
        else:
            # OpenAI's weights were trained with QuickGELU; open_clip only warns on a mismatch.
            tag = open_clip.get_pretrained_cfg(model, pretrained) if pretrained else {}
            self.model, _, _ = open_clip.create_model_and_transforms(
                model, pretrained=pretrained, device=self.device, precision=precision,
                force_quick_gelu=bool(tag.get("quick_gelu", False)),
            )
            self.tokenizer = tokenizer or open_clip.get_tokenizer(model)
        self.model.eval().to(self.device)
        visual = self.model.visual
        cfg = dict(getattr(visual, "preprocess_cfg", None) or {})
        self.size = cfg.get("size", getattr(visual, "image_size", 224))
        self.mean = tuple(cfg.get("mean", open_clip.OPENAI_DATASET_MEAN))
        self.std = tuple(cfg.get("std", open_clip.OPENAI_DATASET_STD))
        self.interpolation = cfg.get("interpolation", "bicubic")
        self.resize_mode = cfg.get("resize_mode", "shortest")
        self.dtype = next(self.model.parameters()).dtype

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 3, H, W]`` in [0, 1] -> L2-normalized embeddings ``[N, D]`` float32."""
        out = []
        for chunk in images.split(self.batch_size):
            x = resize_crop(chunk.to(self.device), self.size, self.interpolation, self.resize_mode)
            x = normalize(x, self.mean, self.std).to(self.dtype)
            out.append(self.model.encode_image(x).float())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """``N`` strings -> L2-normalized embeddings ``[N, D]`` float32."""
        out = []
        for i in range(0, len(texts), self.batch_size):
            tokens = self.tokenizer(texts[i : i + self.batch_size]).to(self.device)
            out.append(self.model.encode_text(tokens).float())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)


def cosine_scores(
    encoder: Any, media: Media, prompts: list[str], clamp: bool = False
) -> torch.Tensor:
    """Per-sample cosine between each sample's frames and its prompt, frames averaged.

    ``encoder`` has ``encode_images([N, 3, H, W]) -> [N, D]`` and ``encode_texts(list) -> [M, D]``,
    both L2-normalized. ``clamp`` clamps each frame's cosine at 0 before averaging.
    Returns ``[B]`` float32 on CPU.
    """
    frames, per_sample = as_frames(media)
    texts, index = unique_prompts(prompts)
    image_emb = encoder.encode_images(frames).cpu()
    text_emb = encoder.encode_texts(texts).cpu()[index].repeat_interleave(per_sample, dim=0)
    cos = (image_emb * text_emb).sum(-1)
    return average_frames(cos.clamp_min(0) if clamp else cos, per_sample)


@register("clip")
class CLIPScore:
    """CLIPScore reward (open_clip).

    Args:
        model, pretrained, device, batch_size, precision, tokenizer: see :class:`OpenClipEncoder`.
        scale: multiplies the cosine (CLIPScore uses 2.5).
        clamp: clamp the cosine at 0 first (CLIPScore does).

    Returns ``scores[B] = scale * cos(image, prompt)`` (clamped if asked); video frames averaged.
    """

    def __init__(
        self,
        model: str | torch.nn.Module = "ViT-B-32",
        pretrained: str | None = "openai",
        device: str | None = None,
        batch_size: int = 32,
        scale: float = 1.0,
        clamp: bool = False,
        precision: str = "fp32",
        tokenizer: Callable[[list[str]], torch.Tensor] | None = None,
    ) -> None:
        self.encoder = OpenClipEncoder(model, pretrained, device, batch_size, precision, tokenizer)
        self.scale, self.clamp = float(scale), bool(clamp)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", "video", reward="clip")
        check_batch(media, prompts, metadata, reward="clip")
        cos = cosine_scores(self.encoder, media, prompts, clamp=self.clamp)
        return RewardOutput(scores=(self.scale * cos).float(), info={"cos_mean": float(cos.mean())})
