"""Region rewards (SpatialFlow-GRPO): score image regions, return a ``[B, h, w]`` score map.

Regions come from ``metadata[i]``:

- ``"boxes"``: ``[[x0, y0, x1, y1], ...]`` in relative coordinates (0 = left/top, 1 = right/bottom);
- or ``"masks"``: ``[mask, ...]``, each ``[h', w']`` (tensor, array or nested lists; nonzero =
  inside) at any resolution;
- optional ``"texts"``: one prompt per region (default: the sample's prompt);
- optional ``"box_metadata"``: one dict per region merged into that crop's metadata (e.g.
  ``{"text": "OPEN"}`` for an OCR inner reward).

Each region is cropped (its box, or its mask's bounding box), letterboxed onto a canvas of
``crop_size`` (default: the image size) filled with the crop's mean color so that padding adds no
edges or brightness, and scored by the inner reward, all crops in one call. Crop ``j`` of a sample
in group ``g`` gets group ``"g/region<j>"`` so a group-wise inner reward compares like with like.

Grid cells: a cell belongs to a box when its center lies inside the box (a box that covers no
center takes the cell holding its own center); to a mask when the mask covers at least half the
cell (else the mask's densest cell). A cell covered by several regions gets their mean score;
a cell outside every region gets the inner reward's score for the whole image.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import RewardOutput, register
from .media import Media, check_batch, require
from .mix import build_reward

_REGION_KEYS = ("boxes", "masks", "texts", "box_metadata")


def box_cells(box: Any, grid: tuple[int, int]) -> torch.Tensor:
    """``[x0, y0, x1, y1]`` relative box -> ``[h, w]`` bool cell mask (see module doc)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
        raise ValueError(f"box {list(box)} must satisfy 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1")
    h, w = grid
    cy = (torch.arange(h, dtype=torch.float64) + 0.5) / h
    cx = (torch.arange(w, dtype=torch.float64) + 0.5) / w
    cells = ((cy >= y0) & (cy <= y1))[:, None] & ((cx >= x0) & (cx <= x1))[None, :]
    if not cells.any():
        r, c = min(int((y0 + y1) / 2 * h), h - 1), min(int((x0 + x1) / 2 * w), w - 1)
        cells[r, c] = True
    return cells


def mask_cells(mask: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``[h', w']`` float mask -> ``[h, w]`` bool cell mask (at least half covered)."""
    cover = torch.nn.functional.adaptive_avg_pool2d(mask[None, None], grid)[0, 0]
    cells = cover >= 0.5
    if not cells.any():
        cells.view(-1)[cover.argmax()] = True
    return cells


def letterbox(crop: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``[N, 3, h, w]`` -> ``[N, 3, *size]``: scaled to fit, padded with the crop's mean color."""
    th, tw = size
    h, w = crop.shape[-2:]
    scale = min(th / h, tw / w)
    nh, nw = max(1, min(th, round(h * scale))), max(1, min(tw, round(w * scale)))
    x = crop.float()
    if (nh, nw) != (h, w):
        x = torch.nn.functional.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True)
    canvas = crop.float().mean(dim=(-2, -1), keepdim=True).expand(*crop.shape[:-2], th, tw).clone()
    top, left = (th - nh) // 2, (tw - nw) // 2
    canvas[..., top : top + nh, left : left + nw] = x
    return canvas.clamp(0, 1)


@register("region")
class RegionReward:
    """Wrap a reward so that it scores regions and returns a ``[B, h, w]`` map.

    Args:
        inner: reward name, spec (see :func:`reward_models.mix.build_reward`) or built reward.
        inner_params: params for ``inner`` when it is a name.
        grid: ``(h, w)`` of the returned map (match the latent grid, or let the trainer resize).
        crop_size: ``(H, W)`` canvas crops are scored on; default the image size.
        score: ``"mean"`` (default): ``scores`` is the mean of the map, so a bad region lowers
            the score by its share of the area; ``"inner"``: the inner reward on the whole image.
    """

    def __init__(
        self,
        inner: Any,
        inner_params: dict | None = None,
        grid: tuple[int, int] | list[int] = (16, 16),
        crop_size: tuple[int, int] | list[int] | None = None,
        score: str = "mean",
    ) -> None:
        if score not in ("mean", "inner"):
            raise ValueError(f"score must be 'mean' or 'inner', got {score!r}")
        self.inner = build_reward(inner, inner_params)
        self.grid = (int(grid[0]), int(grid[1]))
        self.crop_size = None if crop_size is None else (int(crop_size[0]), int(crop_size[1]))
        self.score = score
        self.groupwise = bool(getattr(self.inner, "groupwise", False))

    def _regions(self, meta: dict, height: int, width: int) -> list[tuple[tuple, torch.Tensor]]:
        """``[(pixel box (x0, y0, x1, y1), cells [h, w])]`` for one sample."""
        out = []
        for box in meta.get("boxes") or []:
            x0, y0, x1, y1 = (float(v) for v in box)
            cells = box_cells(box, self.grid)
            px = (math.floor(x0 * width), math.floor(y0 * height))
            px1 = (max(math.ceil(x1 * width), px[0] + 1), max(math.ceil(y1 * height), px[1] + 1))
            out.append(((px[0], px[1], px1[0], px1[1]), cells))
        for mask in meta.get("masks") or []:
            m = torch.as_tensor(mask, dtype=torch.float32).clamp(0, 1)
            if m.dim() != 2 or not m.any():
                shape = tuple(m.shape)
                raise ValueError(f"a region mask must be a non-empty 2-D array, got {shape}")
            full = torch.nn.functional.interpolate(m[None, None], size=(height, width))[0, 0]
            ys, xs = torch.nonzero(full > 0.5, as_tuple=True)
            if len(ys) == 0:  # thinner than a pixel after resizing: use the densest pixel
                flat = int(full.argmax())
                ys, xs = torch.tensor([flat // width]), torch.tensor([flat % width])
            box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
            out.append((box, mask_cells(m, self.grid)))
        return out

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", "video", reward="region")
        check_batch(media, prompts, metadata, reward="region")
        whole = self.inner(media, prompts, metadata)
        height, width = media.data.shape[-2:]
        canvas = self.crop_size or (height, width)
        crops, crop_prompts, crop_meta, owners = [], [], [], []
        for i, meta in enumerate(metadata):
            regions = self._regions(meta, height, width)
            texts = meta.get("texts") or [prompts[i]] * len(regions)
            extra = meta.get("box_metadata") or [{}] * len(regions)
            if len(texts) != len(regions) or len(extra) != len(regions):
                raise ValueError(
                    f"sample {i}: {len(regions)} regions but {len(texts)} texts and "
                    f"{len(extra)} box_metadata entries"
                )
            base = {k: v for k, v in meta.items() if k not in _REGION_KEYS}
            for j, ((x0, y0, x1, y1), cells) in enumerate(regions):
                crop = media.data[i, ..., y0:y1, x0:x1]
                flat = crop.reshape(-1, *crop.shape[-3:])
                crops.append(letterbox(flat, canvas).reshape(*crop.shape[:-2], *canvas))
                crop_prompts.append(texts[j])
                group = f"{meta.get('group', i)}/region{j}"
                crop_meta.append({**base, **extra[j], "group": group, "region": j})
                owners.append((i, cells))
        regions = whole.scores.float().cpu()[:, None, None].repeat(1, *self.grid)
        if crops:
            part = self.inner(Media(media.kind, torch.stack(crops)), crop_prompts, crop_meta)
            total = torch.zeros_like(regions)
            count = torch.zeros_like(regions)
            for (i, cells), s in zip(owners, part.scores.float().cpu()):
                total[i][cells] += s
                count[i][cells] += 1
            covered = count > 0
            regions[covered] = total[covered] / count[covered]
        scores = regions.mean(dim=(1, 2)) if self.score == "mean" else whole.scores.float().cpu()
        info = {"whole_mean": float(whole.scores.float().mean()), "regions_per_sample":
                len(owners) / max(len(media), 1)}
        return RewardOutput(scores=scores, regions=regions, info=info)
