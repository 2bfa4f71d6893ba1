"""LAION aesthetic predictor v2 ("improved aesthetic predictor", Schuhmann 2022).

An MLP head ``768 -> 1024 -> 128 -> 64 -> 16 -> 1`` (dropout between the first layers, and no
nonlinearity: the released model is affine) on the L2-normalized CLIP ViT-L/14 image embedding,
trained to regress the 1-10 ratings of SAC + LOGOS + AVA. DDPO and Flow-GRPO use it with the
transformers ``openai/clip-vit-large-patch14`` image tower; that is the default here.

Head weights load only from safetensors (a local file, a local folder, or a hub repo holding
``model.safetensors``); pickled checkpoints are refused. The head's input width is read from the
weights, so a head for another CLIP width works too.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .base import RewardOutput, register
from .media import Media, as_frames, average_frames, check_batch, require

HIDDEN = (1024, 128, 64, 16)


class AestheticHead(torch.nn.Module):
    """The aesthetic MLP; parameter names match the released checkpoint (``layers.{0,2,4,6,7}``).

    Args:
        dim: input embedding width (768 for ViT-L/14).
    """

    def __init__(self, dim: int = 768) -> None:
        super().__init__()
        h1, h2, h3, h4 = HIDDEN
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(dim, h1), torch.nn.Dropout(0.2),
            torch.nn.Linear(h1, h2), torch.nn.Dropout(0.2),
            torch.nn.Linear(h2, h3), torch.nn.Dropout(0.1),
            torch.nn.Linear(h3, h4), torch.nn.Linear(h4, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[N, dim]`` L2-normalized embeddings -> ``[N]`` predicted rating (about 1-10)."""
        return self.layers(embeddings).squeeze(-1)


def _head_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a saved head's keys onto :class:`AestheticHead` (strip wrappers like ``model.``)."""
    out = {}
    for key, value in state.items():
        if "layers." in key:
            key = key[key.index("layers.") :]
        elif key.split(".")[0].isdigit():
            key = "layers." + key
        out[key] = value
    return out


def load_head(source: str, filename: str = "model.safetensors") -> AestheticHead:
    """Build :class:`AestheticHead` from a safetensors file, a folder holding ``filename``, or a
    hub repo id holding ``filename``."""
    from safetensors.torch import load_file

    if os.path.isdir(source):
        path = os.path.join(source, filename)
    elif os.path.isfile(source):
        path = source
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(source, filename)
    if not str(path).endswith(".safetensors"):
        raise ValueError(
            f"aesthetic head {path!r} is not a .safetensors file; pickled checkpoints are not "
            "loaded; convert it once with safetensors.torch.save_file(state_dict, path)"
        )
    state = _head_state(load_file(str(path)))
    if "layers.0.weight" not in state:
        keys = sorted(state)[:8]
        raise ValueError(f"{path!r} does not look like an aesthetic head; keys: {keys}")
    head = AestheticHead(dim=state["layers.0.weight"].shape[1])
    head.load_state_dict(state)
    return head.eval()


def build_image_encoder(
    backend: str, model: Any, pretrained: str | None, processor: Any, device: str | None,
    batch_size: int,
) -> Any:
    """An encoder with ``encode_images([N, 3, H, W]) -> [N, D]`` (L2-normalized) for ``backend``
    ``"transformers"`` (CLIPModel + CLIPProcessor) or ``"open_clip"``."""
    if backend == "transformers":
        from .pickscore import HFClipEncoder

        return HFClipEncoder(model, processor, device, batch_size)
    if backend == "open_clip":
        from .clip import OpenClipEncoder

        return OpenClipEncoder(model, pretrained, device, batch_size)
    raise ValueError(f"unknown clip_backend {backend!r}; use 'transformers' or 'open_clip'")


@register("aesthetic")
class Aesthetic:
    """LAION aesthetic score (higher is more aesthetic; the prompt is not used).

    Args:
        head: safetensors file, folder, or hub repo id of the MLP head (default a safetensors
            port of ``sac+logos+ava1-l14-linearMSE``).
        head_file: file name inside a folder or hub repo.
        clip_backend: ``"transformers"`` (default, as DDPO / Flow-GRPO) or ``"open_clip"``.
        clip_model: transformers hub id / folder / ``CLIPModel``, or open_clip name / model.
        clip_pretrained: open_clip weights tag or path (open_clip backend only).
        processor: transformers ``CLIPProcessor`` id / folder / instance (default ``clip_model``).
        device: default CUDA when available.
        batch_size: images per forward pass.

    Returns ``scores[B]``: the predicted rating of each image (video frames averaged).
    """

    def __init__(
        self,
        head: str = "ttj/sac-logos-ava1-l14-linearMSE",
        head_file: str = "model.safetensors",
        clip_backend: str = "transformers",
        clip_model: Any = "openai/clip-vit-large-patch14",
        clip_pretrained: str | None = "openai",
        processor: Any = None,
        device: str | None = None,
        batch_size: int = 32,
    ) -> None:
        self.encoder = build_image_encoder(
            clip_backend, clip_model, clip_pretrained, processor, device, batch_size
        )
        self.head = load_head(head, head_file).to(self.encoder.device)

    @torch.no_grad()
    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", "video", reward="aesthetic")
        check_batch(media, prompts, metadata, reward="aesthetic")
        frames, per_sample = as_frames(media)
        embeddings = self.encoder.encode_images(frames)
        ratings = self.head(embeddings.to(self.head.layers[0].weight.dtype)).float().cpu()
        return RewardOutput(scores=average_frames(ratings, per_sample))
