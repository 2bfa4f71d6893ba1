"""Offline rewards for image editing: keep what should stay, check what should change.

The media are the edited images ``[B, 3, H, W]`` in [0, 1]. Each sample's metadata describes the
edit (a prompt-set ``.jsonl`` line such as ``{"prompt": "change the sign to say EXIT", "image":
"/data/src.png", "mask": "/data/mask.png", "boxes": [[0.1, 0.2, 0.5, 0.4]], "text": "EXIT"}``):

- ``"image"``: the source image, a file path or a ``[3, h, w]`` tensor/array in [0, 1], at any
  size: it is resized (bicubic, antialiased) to the edited image's size;
- ``"mask"``: optional edit mask, a file path (white = the region to edit; read as grayscale, at
  least half-white pixels count) or a ``[h, w]`` tensor/array (values >= 0.5 count), any size;
- ``"boxes"``: optional edit boxes ``[[x0, y0, x1, y1], ...]`` in relative coordinates, the same
  convention as the ``region`` reward;
- ``"text"``: optional target text for :class:`RegionOCR` (else the prompt's first quoted span).

The edit region is the mask when there is one, else the union of the boxes. A pixel belongs to a
box when its center lies inside it, and a grid cell follows the ``region`` reward's rules
(:func:`reward_models.regions.box_cells`, :func:`reward_models.regions.mask_cells`). Relative
paths are resolved against the current directory. Decoded files are cached by (absolute path,
modification time), least recently used first out past 256 files. Missing keys, unreadable
files, empty masks and bad boxes raise a one-line ``ValueError``.

Why SSIM and PSNR, not a learned perceptual distance: LPIPS, DISTS and the like need network
weights that an offline install does not carry. SSIM is computed here with the local statistics
restricted to the pixels being compared (normalized convolution), so a change inside the edit
region cannot move the preservation score by even one bit.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from flowgrpo.errors import one_line

from .base import RewardOutput, register
from .cache import FileCache
from .media import Media, check_batch, require, resize_crop
from .mix import build_reward
from .ocr import OCRAccuracy
from .regions import box_cells, letterbox, mask_cells

CACHE_FILES = 256  # decoded source / mask files kept in memory
_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601
_REGION_KEYS = ("image", "mask", "boxes", "box_metadata")


def _decode(name: str, mode: str) -> torch.Tensor:
    """``mode`` ``"RGB"`` -> ``[3, h, w]`` uint8; ``"L"`` -> ``[h, w]`` uint8."""
    import numpy as np
    from PIL import Image, ImageOps

    with Image.open(name) as im:
        array = np.asarray(ImageOps.exif_transpose(im).convert(mode), dtype=np.uint8)
    value = torch.from_numpy(array.copy())
    return value.permute(2, 0, 1).contiguous() if mode == "RGB" else value


FILES: FileCache[torch.Tensor] = FileCache(_decode, max_items=CACHE_FILES)


def _read(path: str, mode: str, what: str) -> torch.Tensor:
    """The decoded file ``path`` (see :func:`_decode`); any failure is one line naming ``what``."""
    try:
        return FILES.get(path, mode)
    except Exception as error:  # noqa: BLE001 - any decoding failure becomes one line
        reason = one_line(error, with_type=True)
        raise ValueError(f"cannot read {what} {path!r} ({reason})") from None


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def load_source(value: Any, size: tuple[int, int], reward: str) -> torch.Tensor:
    """Source image (path or ``[3, h, w]`` in [0, 1]) -> ``[3, *size]`` float32 in [0, 1]."""
    what = f"reward {reward!r}: metadata['image']"
    if _is_path(value):
        image = _read(os.fspath(value), "RGB", what).float() / 255.0
    else:
        image = torch.as_tensor(value).detach().float().cpu()
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"{what} must be a path or a [3, h, w] array, got shape "
                             f"{tuple(image.shape)}")
    return resize_crop(image[None], size, "bicubic", "squash")[0]


def edit_pixels(meta: dict, size: tuple[int, int], reward: str) -> torch.Tensor | None:
    """The sample's edit region as a ``[*size]`` bool pixel mask (mask, else boxes), or ``None``."""
    value = meta.get("mask")
    if value is not None:
        what = f"reward {reward!r}: metadata['mask']"
        if _is_path(value):
            mask = _read(os.fspath(value), "L", what).float() / 255.0
        else:
            mask = torch.as_tensor(value).detach().float().cpu().clamp(0, 1)
            if mask.dim() != 2:
                raise ValueError(f"{what} must be a path or a 2-D array, got shape "
                                 f"{tuple(mask.shape)}")
        if not bool((mask >= 0.5).any()):
            raise ValueError(f"{what} is empty: no pixel is white (>= 0.5)")
        return mask_cells(mask, size)
    boxes = meta.get("boxes")
    if not boxes:
        return None
    pixels = torch.zeros(size, dtype=torch.bool)
    for box in boxes:
        pixels |= box_cells(box, size)
    return pixels


def edit_cells(meta: dict, pixels: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Grid cells ``[*grid]`` of the edit region: box cells (``region``'s rule) or mask cells."""
    if meta.get("mask") is not None:
        return mask_cells(pixels.float(), grid)
    cells = torch.zeros(grid, dtype=torch.bool)
    for box in meta["boxes"]:
        cells |= box_cells(box, grid)
    return cells


def _no_region(i: int, reward: str) -> ValueError:
    return ValueError(f"reward {reward!r} needs an edit region for sample {i}: set "
                      f"metadata['mask'] (a path) or metadata['boxes'] ([[x0, y0, x1, y1]])")


def bounding_box(pixels: torch.Tensor, margin: float = 0.0) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` pixel bounds of a non-empty ``[H, W]`` bool mask, grown by ``margin``
    times its width / height on each side and clipped to the image."""
    ys, xs = torch.nonzero(pixels, as_tuple=True)
    x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    dx, dy = round(margin * (x1 - x0)), round(margin * (y1 - y0))
    height, width = pixels.shape
    return max(0, x0 - dx), max(0, y0 - dy), min(width, x1 + dx), min(height, y1 + dy)


# --- SSIM / PSNR restricted to a set of pixels --------------------------------------------------


def gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Normalized 1-D Gaussian ``[size]`` (float64)."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    return kernel / kernel.sum()


def _blur(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian filter of ``[N, 1, H, W]`` with zero padding (same size out), as one
    depthwise convolution per axis (about twice as fast on CPU as a batch of 1-channel ones)."""
    n, _, h, w = x.shape
    size, pad = kernel.numel(), kernel.numel() // 2
    x = x.reshape(1, n, h, w)
    x = F.conv2d(x, kernel.view(1, 1, size, 1).expand(n, 1, size, 1), padding=(pad, 0), groups=n)
    x = F.conv2d(x, kernel.view(1, 1, 1, size).expand(n, 1, 1, size), padding=(0, pad), groups=n)
    return x.reshape(n, 1, h, w)


def masked_ssim(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, window: int = 11, sigma: float = 1.5,
) -> torch.Tensor:
    """SSIM map ``[N, H, W]`` of ``[N, C, H, W]`` images in [0, 1], channels averaged.

    The local means, variances and covariance at each pixel are Gaussian-weighted averages over
    the pixels where ``weight [N, 1, H, W]`` is 1 only (normalized convolution; image borders are
    handled the same way), so pixels with weight 0 never influence the map. With a weight of all
    ones this is the SSIM of Wang et al. (2004) with an 11x11, sigma 1.5 window, K1 = 0.01,
    K2 = 0.03, data range 1.
    """
    n, c, h, w = x.shape
    kernel = gaussian_window(window, sigma).to(device=x.device, dtype=torch.float32)
    m = weight.float().expand(n, c, h, w).reshape(n * c, 1, h, w)
    x, y = x.float().reshape(n * c, 1, h, w), y.float().reshape(n * c, 1, h, w)
    stats = _blur(torch.cat([m, m * x, m * y, m * x * x, m * y * y, m * x * y], dim=1)
                  .reshape(-1, 1, h, w), kernel).reshape(n * c, 6, h, w)
    norm = stats[:, 0].clamp_min(1e-12)
    mx, my, xx, yy, xy = (stats[:, k] / norm for k in range(1, 6))
    vx, vy, cov = xx - mx * mx, yy - my * my, xy - mx * my
    c1, c2 = 0.01**2, 0.03**2
    ssim = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return ssim.reshape(n, c, h, w).mean(dim=1)


def _luma(images: torch.Tensor) -> torch.Tensor:
    coeffs = torch.tensor(_LUMA, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    return (images * coeffs).sum(dim=1, keepdim=True)


def _psnr_score(mse: torch.Tensor, psnr_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """MSE -> (PSNR in dB capped at ``psnr_max``, PSNR / ``psnr_max`` in [0, 1])."""
    db = (10 * torch.log10(1.0 / mse.clamp_min(1e-30))).clamp(0, psnr_max)
    return db, db / psnr_max


@register("preserve")
class Preserve:
    """Similarity of the edited image to its source OUTSIDE the edit region (higher is better).

    "Outside" is every pixel not in ``metadata["mask"]`` (else not in any of
    ``metadata["boxes"]``), less a band of ``dilate`` pixels around the region that counts as
    neither (edits blend into their surroundings). A sample with neither mask nor boxes compares
    the whole image: then the score is plain structure preservation (e.g. for global restyling).
    A region covering the whole image leaves nothing to compare and scores the maximum.

    Args:
        metric: ``"ssim"`` (default): the mean of the SSIM map over the outside pixels, in
            [-1, 1], 1 when they are unchanged; ``"psnr"``: ``min(PSNR, psnr_max) / psnr_max`` of
            the outside pixels' mean squared error, in [0, 1].
        channels: SSIM on ``"luma"`` (BT.601 Y, default) or on each of ``"rgb"``, averaged. PSNR
            always uses the RGB error.
        window, sigma: the SSIM Gaussian window (11 pixels, sigma 1.5).
        dilate: pixels around the edit region left out of the comparison (default 0).
        psnr_max: the dB value that scores 1 (default 50; identical pixels would be infinite).
        image: the source for samples whose metadata has no ``"image"`` (path or tensor).

    Output: ``scores [B]`` as ``metric`` says; ``info``: ``psnr_db`` (mean capped PSNR),
    ``outside_frac`` (mean share of pixels compared) and, with the ssim metric, ``ssim`` (mean).
    The SSIM map is only computed for the ssim metric, so psnr is several times cheaper.
    """

    name = "preserve"

    def __init__(
        self, metric: str = "ssim", channels: str = "luma", window: int = 11, sigma: float = 1.5,
        dilate: int = 0, psnr_max: float = 50.0, image: Any = None,
    ) -> None:
        if metric not in ("ssim", "psnr"):
            raise ValueError(f"preserve metric must be 'ssim' or 'psnr', got {metric!r}")
        if channels not in ("luma", "rgb"):
            raise ValueError(f"preserve channels must be 'luma' or 'rgb', got {channels!r}")
        if int(window) < 1 or int(window) % 2 == 0 or not float(sigma) > 0:
            raise ValueError(f"preserve window must be odd and positive and sigma > 0, got "
                             f"window={window}, sigma={sigma}")
        if int(dilate) < 0 or not float(psnr_max) > 0:
            raise ValueError(f"preserve dilate must be >= 0 and psnr_max > 0, got dilate={dilate},"
                             f" psnr_max={psnr_max}")
        self.metric, self.channels = metric, channels
        self.window, self.sigma = int(window), float(sigma)
        self.dilate, self.psnr_max = int(dilate), float(psnr_max)
        self.image = image

    def maps(
        self, media: Media, metadata: list[dict], reward: str
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """Per-pixel maps on the media's device: SSIM ``[B, H, W]`` (``None`` with the psnr
        metric), squared RGB error ``[B, H, W]``, outside weight ``[B, 1, H, W]`` (float 0/1), and
        each sample's edit pixels ``[H, W]`` (CPU bool, ``None`` without a region)."""
        edited = media.data.float().clamp(0, 1)
        size = (edited.shape[-2], edited.shape[-1])
        sources, regions = [], []
        for i, meta in enumerate(metadata):
            value = meta.get("image", self.image)
            if value is None:
                raise ValueError(f"reward {reward!r} needs the source image for sample {i}: set "
                                 f"metadata['image'] (a path) or the image=<path> parameter")
            sources.append(load_source(value, size, reward))
            regions.append(edit_pixels(meta, size, reward))
        source = torch.stack(sources).to(edited.device)
        inside = torch.stack([torch.zeros(size, dtype=torch.bool) if r is None else r
                              for r in regions]).to(edited.device)[:, None].float()
        if self.dilate:
            inside = F.max_pool2d(inside, 2 * self.dilate + 1, stride=1, padding=self.dilate)
        outside = 1.0 - inside
        ssim = None
        if self.metric == "ssim" and self.channels == "luma":
            ssim = masked_ssim(_luma(edited), _luma(source), outside, self.window, self.sigma)
        elif self.metric == "ssim":
            ssim = masked_ssim(edited, source, outside, self.window, self.sigma)
        error = (edited - source).pow(2).mean(dim=1)
        return ssim, error, outside, regions

    def reduce(
        self, ssim: torch.Tensor | None, error: torch.Tensor, outside: torch.Tensor,
        grid: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(score, capped PSNR dB, outside count) over the outside pixels: ``[B]`` for the whole
        image, ``[B, *grid]`` per cell; an area with no outside pixel gets NaN."""
        w = outside[:, 0]

        def mean(values: torch.Tensor) -> torch.Tensor:
            if grid is None:
                return (values * w).sum(dim=(1, 2)) / count
            return F.adaptive_avg_pool2d((values * w)[:, None], grid)[:, 0] / count

        count = w.sum(dim=(1, 2)) if grid is None else F.adaptive_avg_pool2d(w[:, None], grid)[:, 0]
        db, psnr_score = _psnr_score(mean(error), self.psnr_max)
        db = torch.where(count > 0, db, torch.full_like(db, math.nan))
        score = psnr_score if ssim is None else mean(ssim)
        return score, db, count

    def summary(
        self, ssim: torch.Tensor, error: torch.Tensor, outside: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """``[B]`` CPU scores over the outside pixels (the maximum where there are none) and
        ``info``."""
        score, db, count = (t.float().cpu() for t in self.reduce(ssim, error, outside))
        empty = count == 0  # the edit region covers everything: nothing to preserve
        score = torch.where(empty, torch.ones_like(score), score)
        info = {
            "psnr_db": float(torch.where(empty, self.psnr_max, db).mean()),
            "outside_frac": float(outside.mean()),
        }
        if ssim is not None:
            info["ssim"] = float(score.mean())
        return score, info

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", reward=self.name)
        check_batch(media, prompts, metadata, reward=self.name)
        ssim, error, outside, _ = self.maps(media, metadata, self.name)
        score, info = self.summary(ssim, error, outside)
        return RewardOutput(scores=score, info=info)


@register("region_ocr")
class RegionOCR:
    """OCR accuracy inside the edit region (the ``ocr`` reward's score, on a crop).

    The crop is the bounding box of ``metadata["mask"]``, else the first of ``metadata["boxes"]``,
    grown by ``margin`` on each side, letterboxed like the ``region`` reward's crops onto a canvas
    of ``crop_size`` (default: the image size; text is found more reliably when a small box is
    enlarged). The target is ``metadata["text"]``, else the prompt's first quoted span; the score
    is ``max(0, 1 - levenshtein / len(target))`` after the ``ocr`` reward's normalization, in
    [0, 1]. Text outside the crop does not count, so a sign left unchanged elsewhere costs nothing.

    Args:
        margin: context around the box, as a fraction of its width / height (default 0: text
            touching the box edge still reads, and a neighbouring sign stays out).
        crop_size: ``(H, W)`` of the OCR canvas.
        case_sensitive, keep_whitespace, contains_is_exact, min_confidence, threads,
            engine_params: as the ``ocr`` reward.

    Output: ``scores [B]``; ``info``: ``exact_frac`` (share of samples read exactly).
    """

    name = "region_ocr"

    def __init__(
        self, margin: float = 0.0, crop_size: tuple[int, int] | list[int] | None = None,
        case_sensitive: bool = False, keep_whitespace: bool = False,
        contains_is_exact: bool = False, min_confidence: float = 0.5, threads: int = -1,
        engine_params: dict | None = None,
    ) -> None:
        if not float(margin) >= 0:
            raise ValueError(f"region_ocr margin must be >= 0, got {margin}")
        self.margin = float(margin)
        self.crop_size = None if crop_size is None else (int(crop_size[0]), int(crop_size[1]))
        self.ocr = OCRAccuracy(case_sensitive, keep_whitespace, contains_is_exact, min_confidence,
                               threads, engine_params)

    def crops(self, media: Media, metadata: list[dict]) -> torch.Tensor:
        """``[B, 3, *canvas]``: each sample's edit crop, letterboxed."""
        size = (media.data.shape[-2], media.data.shape[-1])
        canvas = self.crop_size or size
        out = []
        for i, meta in enumerate(metadata):
            if meta.get("mask") is None and meta.get("boxes"):
                meta = {"boxes": meta["boxes"][:1]}  # the first box only
            pixels = edit_pixels(meta, size, self.name)
            if pixels is None:
                raise _no_region(i, self.name)
            x0, y0, x1, y1 = bounding_box(pixels, self.margin)
            crop = media.data[i : i + 1, :, y0:y1, x0:x1].float().clamp(0, 1).cpu()
            out.append(letterbox(crop, canvas)[0])
        return torch.stack(out)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", reward=self.name)
        check_batch(media, prompts, metadata, reward=self.name)
        return self.ocr(Media("image", self.crops(media, metadata)), prompts, metadata)


@register("edit_regions")
class EditRegions:
    """Edit reward with region credit (SpatialFlow-GRPO): edit score in the edit region,
    preservation everywhere else.

    ``regions [B, h, w]``: a cell of the edit region (``region``'s cell rules) carries
    ``edit_weight`` times its edit score; every other cell carries ``preserve_weight`` times the
    ``preserve`` score of that cell's outside pixels (the SSIM map averaged over them, or their
    PSNR score). So region advantages push on the edit only where it belongs and on fidelity
    elsewhere.
    ``scores = edit_weight * edit + preserve_weight * preserve``, with ``preserve`` the whole
    image's ``preserve`` score and ``edit`` the mean over the sample's edit cells.

    The edit score comes from ``inner`` (a registered name with ``inner_params``, a spec, or a
    built reward; default ``region_ocr``):

    - ``crop=False`` (default): ``inner`` scores the whole edited image with the sample's own
      metadata, one score per sample on all its edit cells. Use a region-aware inner reward
      (``region_ocr``) or a whole-image one (instruction following).
    - ``crop=True``: like the ``region`` reward, ``inner`` scores crops: the mask's bounding box,
      or each box (its cells get its score; a cell in several boxes their mean), letterboxed
      onto ``crop_size`` (default the image size), with the metadata less ``image``, ``mask``
      and ``boxes``, merged with ``metadata["box_metadata"][j]`` when given, in group
      ``"<group>/edit<j>"``. Any image reward (``ocr``, ``clip``, ...) then judges the region only.

    Args:
        inner, inner_params, crop, crop_size: the edit score, as above.
        grid: ``(h, w)`` of ``regions`` (default 16 x 16).
        edit_weight, preserve_weight: weights of the two parts (default 1 and 1).
        preserve_params: options of the ``preserve`` part (``metric``, ``channels``, ``dilate``,
            ...). A cell outside the edit region with no compared pixel (all in the ``dilate``
            band) gets the sample's whole ``preserve`` score.
        image: the source for samples whose metadata has no ``"image"``.

    Every sample needs an edit region (``mask`` or ``boxes``). ``components``: ``edit`` and
    ``preserve`` (unweighted, ``[B]``); ``info``: the inner reward's as ``edit/<key>``, the
    preserve part's as ``preserve/<key>``, and ``edit_cells_frac``.
    """

    name = "edit_regions"

    def __init__(
        self, inner: Any = "region_ocr", inner_params: dict | None = None, crop: bool = False,
        crop_size: tuple[int, int] | list[int] | None = None,
        grid: tuple[int, int] | list[int] = (16, 16), edit_weight: float = 1.0,
        preserve_weight: float = 1.0, preserve_params: dict | None = None, image: Any = None,
    ) -> None:
        self.inner = build_reward(inner, inner_params)
        self.crop = bool(crop)
        self.crop_size = None if crop_size is None else (int(crop_size[0]), int(crop_size[1]))
        self.grid = (int(grid[0]), int(grid[1]))
        if min(self.grid) < 1:
            raise ValueError(f"edit_regions grid must be positive, got {list(grid)}")
        self.edit_weight, self.preserve_weight = float(edit_weight), float(preserve_weight)
        self.preserve = Preserve(**{"image": image, **(preserve_params or {})})
        self.groupwise = bool(getattr(self.inner, "groupwise", False))

    def _crop_scores(
        self, media: Media, prompts: list[str], metadata: list[dict],
        pixels: list[torch.Tensor], cells: torch.Tensor,
    ) -> tuple[torch.Tensor, dict]:
        """``[B, *grid]`` inner scores of the edit crops (0 outside the edit cells)."""
        size = (media.data.shape[-2], media.data.shape[-1])
        canvas = self.crop_size or size
        crops, crop_prompts, crop_meta, owners = [], [], [], []
        for i, meta in enumerate(metadata):
            if meta.get("mask") is not None:
                parts = [(pixels[i], cells[i])]
            else:
                parts = [(box_cells(b, size), box_cells(b, self.grid)) for b in meta["boxes"]]
            extra = meta.get("box_metadata") or [{}] * len(parts)
            if len(extra) != len(parts):
                raise ValueError(f"sample {i}: {len(parts)} edit regions but {len(extra)} "
                                 f"box_metadata entries")
            base = {k: v for k, v in meta.items() if k not in _REGION_KEYS}
            for j, (part_pixels, part_cells) in enumerate(parts):
                x0, y0, x1, y1 = bounding_box(part_pixels)
                crop = media.data[i : i + 1, :, y0:y1, x0:x1].float().clamp(0, 1)
                crops.append(letterbox(crop, canvas)[0])
                crop_prompts.append(prompts[i])
                group = f"{meta.get('group', i)}/edit{j}"
                crop_meta.append({**base, **extra[j], "group": group, "region": j})
                owners.append((i, part_cells))
        out = self.inner(Media("image", torch.stack(crops)), crop_prompts, crop_meta)
        total = torch.zeros(len(metadata), *self.grid)
        count = torch.zeros_like(total)
        for (i, part_cells), s in zip(owners, out.scores.float().cpu()):
            total[i][part_cells] += s
            count[i][part_cells] += 1
        return total / count.clamp_min(1), out.info

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "image", reward=self.name)
        check_batch(media, prompts, metadata, reward=self.name)
        ssim, error, outside, pixels = self.preserve.maps(media, metadata, self.name)
        for i, p in enumerate(pixels):
            if p is None:
                raise _no_region(i, self.name)
        cells = torch.stack([edit_cells(m, p, self.grid) for m, p in zip(metadata, pixels)])
        whole, preserve_info = self.preserve.summary(ssim, error, outside)
        local, _, count = self.preserve.reduce(ssim, error, outside, self.grid)
        local = torch.where(count.cpu() > 0, local.float().cpu(),  # no outside pixel: whole's
                            whole[:, None, None].expand(-1, *self.grid))

        if self.crop:
            edit_map, inner_info = self._crop_scores(media, prompts, metadata, pixels, cells)
        else:
            out = self.inner(media, prompts, metadata)
            edit_map = out.scores.float().cpu()[:, None, None].expand(-1, *self.grid).clone()
            inner_info = out.info
        edit = (edit_map * cells).sum(dim=(1, 2)) / cells.sum(dim=(1, 2))
        regions = torch.where(cells, self.edit_weight * edit_map, self.preserve_weight * local)
        scores = self.edit_weight * edit + self.preserve_weight * whole
        info = {f"edit/{k}": v for k, v in inner_info.items()}
        info.update({f"preserve/{k}": v for k, v in preserve_info.items()})
        info["edit_cells_frac"] = float(cells.float().mean())
        return RewardOutput(scores=scores.float(), regions=regions.float(),
                            components={"edit": edit.float(), "preserve": whole.float()},
                            info=info)
