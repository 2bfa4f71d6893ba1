"""Qwen-Image-Edit (image editing) through diffusers' ``QwenImageEditPipeline``, and its
multi-image successor (Qwen-Image-Edit-2509 / -2511) through ``QwenImageEditPlusPipeline``.

Qwen-Image-Edit is Qwen-Image (:mod:`pipelines.qwen_image`: the same MMDiT, VAE, packing,
schedule and true CFG with the per-token norm rescale) with the source image in two places:

- the Qwen2.5-VL text encoder sees it: the prompt is wrapped in an edit template holding the
  image's vision tokens (the first 64 template tokens are dropped), so the prompt embedding is
  the instruction read against the image, and the negative prompt's is too;
- its VAE latents (the posterior's mode, normalised by the VAE's ``latents_mean/std``) are
  packed into tokens exactly as the generated image is and appended after the noisy tokens; the
  rotary embedding gets one ``(frame, rows, cols)`` entry per image (``img_shapes``: the
  generated image at frame 0, the ``i``-th reference at frame ``i + 1``), and the model's output
  is cut back to the generated tokens.

Latents are the packed generated tokens ``[B, L, 4C]`` only (the references live in the
:class:`~pipelines.base.Cond`, so samplers, log-probs, KLs and region maps never see them); the
schedule's shift ``mu = calculate_shift(L)`` counts the generated tokens only, as the pipeline.

Reference preprocessing is the pipeline's, at a configurable size. ``QwenImageEditPipeline``
resizes a source to about ``1024 * 1024`` pixels keeping its aspect ratio (``calculate_dimensions``:
sides rounded to multiples of 32) and feeds that one image to both the VAE and the text encoder
(whose processor may shrink it further); ``QwenImageEditPlusPipeline`` resizes each source twice:
to about ``1024 * 1024`` for the VAE and ``384 * 384`` for the text encoder. The adapter's
``reference_area`` (and the plus family's ``condition_area``) are those areas; at their defaults
the encodings are the pipeline's, smaller ones trade fidelity for speed (a 1 MP reference is
4096 tokens beside the 1024 generated ones of a 512 px edit).

Differences from the pipelines, on purpose: the output size is the adapter's ``height x width``
(the pipelines default to the reference's size; pass ``height``/``width`` to them to match); the
pipelines take one prompt per call (their processor pairs the batch's images with its prompts one
to one, and the plus pipeline refuses batches), the adapter encodes each sample alone as they do
and pads the batch's prompt embeddings with masked zeros, so one model call serves the batch.
Qwen2.5-VL's encoder masks the padding, so a padded row's velocity is its unpadded one.

Source images come from each sample's metadata ``"image"`` (a path, a PIL image, a
``[3, h, w]`` / ``[1, 3, h, w]`` tensor in [0, 1] taken as its 8-bit image; the plus family
also a list of them), else from the ``image`` option. Every sample of a batch needs references
of one size (the transformer's rotary embedding takes one ``img_shapes`` per batch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .base import Cond, load_pipeline, register
from .flux import pack_latents
from .flux2 import to_pil
from .flux_kontext import load_source_image
from .qwen_image import QwenImageAdapter

REFERENCE_AREA = 1024 * 1024  # both pipelines' VAE reference area
CONDITION_AREA = 384 * 384  # the plus pipeline's text-encoder reference area


@register("qwen_image_edit")
class QwenImageEditAdapter(QwenImageAdapter):
    """Adapter for any diffusers ``QwenImageEditPipeline`` folder or hub id
    (``Qwen/Qwen-Image-Edit``).

    Args:
        path_or_id: hub id or local folder.
        height, width: size of the generated image in pixels, multiples of ``2 * vae_scale``
            (16); ``None``: 1024.
        reference_area: pixels a source is resized to (aspect ratio kept, sides multiples of
            32) before the VAE and the text encoder see it; ``1024 * 1024``, the pipeline's.
        image: the source of samples whose metadata has no ``"image"`` (a path, a PIL image or
            a tensor in [0, 1]); ``None``: every sample must bring its own.
        torch_dtype: weights dtype (``"bfloat16"`` is the usual).
        negative_prompt: the CFG negative (``" "``, as in Qwen-Image-Edit's examples); it is
            read against the source image too.
        pipeline: an already built pipeline (tests, custom components).
    """

    pipeline_classes = ("QwenImageEditPipeline",)
    family = "qwen_image_edit"
    # the VAE encodes the sources next to the text encoder (offloaded with it)
    text_encoder_names = ("text_encoder", "vae")
    condition_keys = ("image",)

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        reference_area: int = REFERENCE_AREA,
        image: Any = None,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = " ",
        pipeline: Any = None,
        **kwargs: Any,
    ) -> None:
        import diffusers

        self.reference_area = self._area("reference_area", reference_area)
        cls = getattr(diffusers, self.pipeline_classes[0])
        pipeline = load_pipeline(cls, self.family, path_or_id, torch_dtype, pipeline, **kwargs)
        super().__init__(height=height, width=width, torch_dtype=torch_dtype,
                         negative_prompt=negative_prompt, max_sequence_length=1024,
                         pipeline=pipeline)
        self.image = image

    def _area(self, name: str, area: Any) -> int:
        if isinstance(area, bool) or not isinstance(area, int) or area < 32 * 32:
            raise ValueError(f"{self.family}: {name} must be a pixel count of at least 32 * 32 "
                             f"(the pipeline's is {REFERENCE_AREA}), got {area!r}")
        return area

    # -- references ---------------------------------------------------------------------------
    def reference_size(self, image: Any, area: int) -> tuple[int, int]:
        """``(height, width)`` a source is resized to: the pipelines' ``calculate_dimensions``
        (about ``area`` pixels, its aspect ratio, sides multiples of 32)."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
            calculate_dimensions,
        )

        width, height = calculate_dimensions(area, image.width / image.height)
        if width < 32 or height < 32:
            raise ValueError(f"{self.family}: a {image.width}x{image.height} source comes out "
                             f"{width}x{height} at {area} pixels; use a less elongated image")
        return height, width

    def sources(self, metadata: list[dict] | None, n: int) -> list[Any]:
        """Each sample's source(s): its metadata ``"image"``, else the ``image`` option."""
        if metadata is not None and len(metadata) != n:
            raise ValueError(f"{self.family}: {n} prompts but {len(metadata)} metadata rows")
        rows = metadata if metadata is not None else [{}] * n
        images = [(m or {}).get("image") for m in rows]
        images = [self.image if s is None else s for s in images]
        missing = [i for i, s in enumerate(images) if s is None]
        if missing:
            raise ValueError(f"{self.family}: samples {missing} have no source image; give each "
                             f"prompt an 'image' (a .jsonl prompt set) or set the image option")
        return images

    def load_sources(self, source: Any) -> list[Any]:
        """One sample's source(s) as RGB PIL images (one for this family)."""
        if isinstance(source, (list, tuple)):
            raise ValueError(f"{self.family} takes one source image per sample, got a list of "
                             f"{len(source)}; use qwen_image_edit_plus for several")
        return [to_pil(load_source_image(source, self.family))]

    def prepare_references(self, images: list[Any]) -> tuple[Any, list[torch.Tensor]]:
        """Sources -> (the text encoder's image input, each VAE input ``[1, 3, 1, h, w]`` in
        [-1, 1]): ``QwenImageEditPipeline.__call__``'s step 3, one resized image for both."""
        processor = self.pipeline.image_processor
        height, width = self.reference_size(images[0], self.reference_area)
        resized = processor.resize(images[0], height, width)
        return resized, [processor.preprocess(resized, height, width).unsqueeze(2)]

    @torch.no_grad()
    def encode_sample(self, prompt: str, source: Any) -> dict[str, torch.Tensor]:
        """One sample, as the pipeline encodes it: the prompt and negative embeddings read
        against its source(s) (``[1, T, D]`` each, no padding), the packed reference tokens
        ``image_latents [1, L_ref, 4C]`` and their grids ``image_shapes [1, R, 3]``."""
        pipe = self.pipeline
        prompt_image, vae_inputs = self.prepare_references(self.load_sources(source))
        out = {}
        for key, text in (("prompt_embeds", prompt), ("neg_prompt_embeds", self.negative_prompt)):
            embeds, _ = pipe.encode_prompt(prompt=[text], image=prompt_image, device=self.device)
            out[key] = embeds.to(self.dtype)
        tokens, shapes = [], []
        vae = pipe.vae
        vae_device = next(vae.parameters()).device
        for pixels in vae_inputs:
            latents = pipe._encode_vae_image(pixels.to(vae_device, vae.dtype), None)[:, :, 0]
            tokens.append(pack_latents(latents))
            shapes.append((1, latents.shape[-2] // 2, latents.shape[-1] // 2))
        out["image_latents"] = torch.cat(tokens, 1).to(self.device, self.dtype)
        out["image_shapes"] = torch.tensor([shapes], device=self.device)
        return out

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """Each sample encoded alone (:meth:`encode_sample`; a repeated (prompt, source) once),
        the prompt and negative embeddings zero-padded to one length ``T`` with masks
        ``prompt_mask`` / ``neg_prompt_mask [B, T]`` (1: a token)."""
        cache: dict[Any, dict[str, torch.Tensor]] = {}
        rows = []
        for prompt, source in zip(prompts, self.sources(metadata, len(prompts)), strict=True):
            key = (prompt, source if isinstance(source, str) else id(source))
            if key not in cache:
                cache[key] = self.encode_sample(prompt, source)
            rows.append(cache[key])
        for name in ("image_latents", "image_shapes"):
            if any(r[name].shape != rows[0][name].shape for r in rows):
                raise ValueError(f"{self.family}: the sources of one batch come out in different "
                                 f"sizes; give them one aspect ratio (or batch them apart)")
        length = max(r[k].shape[1] for r in rows for k in ("prompt_embeds", "neg_prompt_embeds"))
        tensors = {}
        for key in ("prompt_embeds", "neg_prompt_embeds"):
            mask = key.replace("embeds", "mask")
            tensors[key] = torch.cat([F.pad(r[key], (0, 0, 0, length - r[key].shape[1]))
                                      for r in rows])
            tensors[mask] = torch.cat([F.pad(torch.ones(1, r[key].shape[1], dtype=torch.long,
                                                        device=self.device),
                                             (0, length - r[key].shape[1])) for r in rows])
        for name in ("image_latents", "image_shapes"):
            tensors[name] = torch.cat([r[name] for r in rows])
        return Cond(tensors)

    def encode(self, prompts: list[str]) -> Cond:
        """:meth:`encode_inputs` without metadata: every sample edits the ``image`` option."""
        return self.encode_inputs(prompts)

    # -- model call ---------------------------------------------------------------------------
    def _call(self, x: torch.Tensor, timestep: torch.Tensor, embeds: torch.Tensor,
              mask: torch.Tensor, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """One transformer call on ``[x; references]`` with one ``img_shapes`` entry per image
        (the generated one first), cut back to the generated tokens. Through
        :meth:`QwenImageAdapter.velocity`: CFG with the pipeline's per-token rescale, both
        branches seeing the same references."""
        shapes = tensors["image_shapes"]
        if len(shapes) > 1 and not bool((shapes == shapes[:1]).all()):
            raise ValueError(f"{self.family}: the references of one batch have different sizes; "
                             f"give the sources one aspect ratio (or batch them apart)")
        h, w = self.latent_grid()
        refs = [tuple(int(v) for v in s) for s in shapes[0]]
        hidden = torch.cat([x, tensors["image_latents"].to(x.device, x.dtype)], 1)
        out = self._model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=embeds,
                          encoder_hidden_states_mask=mask,
                          img_shapes=[[(1, h // 2, w // 2), *refs]] * x.shape[0])
        return out[:, :x.shape[1]]


@register("qwen_image_edit_plus")
class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """Adapter for any diffusers ``QwenImageEditPlusPipeline`` folder or hub id
    (``Qwen/Qwen-Image-Edit-2509``, ``Qwen/Qwen-Image-Edit-2511``): one or several sources per
    sample (metadata ``"image"`` a list), each named "Picture i" in the prompt.

    Args:
        condition_area: pixels each source is resized to for the text encoder
            (``384 * 384``, the pipeline's).
        reference_area: pixels each source is resized to for the VAE (``1024 * 1024``).
        Others: as :class:`QwenImageEditAdapter`.
    """

    pipeline_classes = ("QwenImageEditPlusPipeline",)
    family = "qwen_image_edit_plus"

    def __init__(self, path_or_id: str | None = None, *, condition_area: int = CONDITION_AREA,
                 **options: Any) -> None:
        self.condition_area = self._area("condition_area", condition_area)
        super().__init__(path_or_id, **options)

    def load_sources(self, source: Any) -> list[Any]:
        sources = list(source) if isinstance(source, (list, tuple)) else [source]
        if not sources:
            raise ValueError(f"{self.family}: an empty list of source images")
        return [to_pil(load_source_image(s, self.family)) for s in sources]

    def prepare_references(self, images: list[Any]) -> tuple[Any, list[torch.Tensor]]:
        """Sources -> (the text encoder's images, each VAE input ``[1, 3, 1, h, w]``): the plus
        pipeline's two resizes of every source, from the original each time."""
        processor = self.pipeline.image_processor
        conditions, vae_inputs = [], []
        for image in images:
            height, width = self.reference_size(image, self.condition_area)
            conditions.append(processor.resize(image, height, width))
            height, width = self.reference_size(image, self.reference_area)
            vae_inputs.append(processor.preprocess(image, height, width).unsqueeze(2))
        return conditions, vae_inputs
