"""FLUX.1 Kontext (image editing) through diffusers' ``FluxKontextPipeline``.

Kontext is FLUX.1 with the source image in context: the source is VAE-encoded (the posterior's
mode, as the pipeline does), shifted and scaled like any FLUX latent and packed into tokens
exactly as the generated image is; those reference tokens are appended after the noisy tokens,
with rotary ids ``(1, row, col)`` (the generated tokens have ``(0, row, col)``), and the model's
output is cut back to the noisy tokens.

Everything else is :class:`~pipelines.flux.FluxAdapter`'s: latents are the packed generated
tokens ``[B, L, 4C]`` only (the reference tokens live in the :class:`~pipelines.base.Cond`, so
samplers, log-probs, KLs and region maps never see them); the schedule's dynamic shift
``mu = calculate_shift(L)`` counts the generated tokens only, as the pipeline does; ``guidance``
is the guidance-embedding value (Kontext-dev: 2.5 in the pipeline's examples); true CFG against
``negative_prompt`` is an option, the negative branch sees the same reference.

Source images come from each sample's metadata ``"image"`` (a path, a PIL image, or a
``[3, h, w]`` / ``[1, 3, h, w]`` tensor in [0, 1]; :meth:`FluxKontextAdapter.encode_inputs`).
Without one, a sample is plain text-to-image, as ``FluxKontextPipeline`` with ``image=None``. A
batch is either all edits or all text-to-image, and all its references have one size (the
default ``reference_size="output"`` guarantees it).

Output size: the adapter generates ``height x width``. ``FluxKontextPipeline`` rescales the
requested size to ``max_area`` (default 1024^2) keeping its aspect ratio; it generates the
adapter's size when called with ``max_area=height * width``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from flowgrpo.validation import one_of

from .base import Cond, guided_call, load_pipeline, register
from .flux import FluxAdapter, pack_latents

REFERENCE_SIZES = ("output", "source", "auto")


def load_source_image(value: Any, family: str) -> Any:
    """A source image as the pipelines take it: a path is read (EXIF orientation applied, RGB)
    with diffusers' ``load_image``; a PIL image is converted to RGB; a ``[3, h, w]`` or
    ``[1, 3, h, w]`` tensor in [0, 1] becomes ``[1, 3, h, w]`` float32."""
    import PIL.Image

    if isinstance(value, str) or hasattr(value, "__fspath__"):
        from diffusers.utils import load_image

        return load_image(os.fspath(value))
    if isinstance(value, PIL.Image.Image):
        return value.convert("RGB")
    if isinstance(value, torch.Tensor):
        image = value.detach().float().cpu()
        image = image[None] if image.dim() == 3 else image
        if image.dim() != 4 or image.shape[:2] != (1, 3):
            raise ValueError(f"{family}: a source image tensor must be [3, h, w] or [1, 3, h, w] "
                             f"in [0, 1], got shape {list(value.shape)}")
        return image
    raise ValueError(f"{family}: a source image must be a file path, a PIL image or a tensor, "
                     f"got {type(value).__name__}")


def image_size(image: Any) -> tuple[int, int]:
    """``(height, width)`` of a PIL image or a ``[1, 3, h, w]`` tensor."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    return image.height, image.width


def sources_of(metadata: list[dict] | None, n: int, family: str) -> list[Any] | None:
    """Each sample's metadata ``"image"``; None when no sample has one (text-to-image)."""
    if metadata is None:
        return None
    if len(metadata) != n:
        raise ValueError(f"{family}: {n} prompts but {len(metadata)} metadata rows")
    values = [m.get("image") if m else None for m in metadata]
    given = [v is not None for v in values]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(f"{family}: samples {[i for i, g in enumerate(given) if not g]} have no "
                         f"source 'image' but others do; encode edits and text-to-image prompts "
                         f"in separate batches")
    return values


def shared_ids(ids: torch.Tensor, family: str) -> torch.Tensor:
    """The reference ids ``[L_ref, D]`` of a batch, which the transformer takes once for all
    rows: every sample's must be the same (samples encoded one by one and concatenated can have
    references of equal token counts but different grids, e.g. 20x28 and 28x20 pixels)."""
    if len(ids) > 1 and not bool((ids == ids[:1]).all()):
        raise ValueError(f"{family}: the references of one batch have different sizes; use "
                         f"reference_size='output' (or sources of one size)")
    return ids[0]


def gather_references(sources: list[Any], encode: Any, mismatch: str) -> dict[str, torch.Tensor]:
    """``image_latents [B, L_ref, 4C]`` and ``image_ids [B, L_ref, d]`` of each sample's
    source(s): ``encode(source) -> (tokens [1, L_ref, 4C], ids [L_ref, d])``, run once per distinct
    source (a path, a list of paths, or the same object). All samples' ids must agree (one
    batched model call); otherwise ``ValueError(mismatch.format(lengths=...))``."""
    cache: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
    refs = []
    for source in sources:  # a source shared by several prompts is encoded once
        if isinstance(source, str):
            key: Any = source
        elif isinstance(source, (list, tuple)) and all(isinstance(x, str) for x in source):
            key = tuple(source)
        else:
            key = id(source)
        if key not in cache:
            cache[key] = encode(source)
        refs.append(cache[key])
    ids = refs[0][1]
    if any(r[1].shape != ids.shape or not torch.equal(r[1], ids) for r in refs):
        raise ValueError(mismatch.format(lengths=sorted({r[0].shape[1] for r in refs})))
    return {"image_latents": torch.cat([r[0] for r in refs]),
            "image_ids": torch.stack([r[1] for r in refs])}


@register("flux_kontext")
class FluxKontextAdapter(FluxAdapter):
    """Adapter for any diffusers ``FluxKontextPipeline`` folder or hub id (FLUX.1 Kontext-dev).

    Args:
        path_or_id: hub id (``black-forest-labs/FLUX.1-Kontext-dev``) or local folder.
        height, width: size of the generated image in pixels, multiples of ``2 * vae_scale``
            (16); ``None``: 1024.
        reference_size: how a source image is sized before encoding, always with the pipeline's
            own resize and preprocessing:
            ``"output"`` (default): resized to ``height x width`` (the pipeline's plain resize,
            which does not keep the aspect ratio; crop sources to the output's aspect ratio
            beforehand to avoid stretching). Every reference of a batch then has the generated
            image's token count; the pipeline does the same for a source of that size with
            ``_auto_resize=False``;
            ``"source"``: its own size rounded down to multiples of 16 (the pipeline's rule with
            ``_auto_resize=False``);
            ``"auto"``: the Kontext training resolution (about 1 MP) closest to its aspect ratio,
            the pipeline's default (``_auto_resize=True``).
            With ``"source"`` and ``"auto"``, the sources of one batch must come out the same size.
        torch_dtype, true_cfg_scale, negative_prompt, max_sequence_length, pipeline: as
            :class:`~pipelines.flux.FluxAdapter`.
    """

    pipeline_classes = ("FluxKontextPipeline",)
    # the VAE encodes the source images next to the text encoders (offloaded with them)
    text_encoder_names = ("text_encoder", "text_encoder_2", "vae")
    condition_keys = ("image",)

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        reference_size: str = "output",
        torch_dtype: str | torch.dtype = "float32",
        true_cfg_scale: float = 1.0,
        negative_prompt: str = "",
        max_sequence_length: int = 512,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import FluxKontextPipeline

        one_of("flux_kontext: reference_size", reference_size, REFERENCE_SIZES)
        pipeline = load_pipeline(FluxKontextPipeline, "flux_kontext", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        factor = 2 * pipeline.vae_scale_factor
        if (height or factor) % factor or (width or factor) % factor:
            raise ValueError(f"flux_kontext: height and width must be multiples of {factor}, got "
                             f"{height} x {width}")
        super().__init__(height=height, width=width, torch_dtype=torch_dtype,
                         true_cfg_scale=true_cfg_scale, negative_prompt=negative_prompt,
                         max_sequence_length=max_sequence_length, pipeline=pipeline)
        self.reference_size = reference_size

    # -- source images ------------------------------------------------------------------------
    def reference_pixels(self, image: Any) -> torch.Tensor:
        """A source image (path, PIL image or tensor in [0, 1]) -> ``[1, 3, h, w]`` in [-1, 1],
        resized and normalised by the pipeline's image processor as ``FluxKontextPipeline``
        does, at the size :attr:`reference_size` gives."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        image = load_source_image(image, "flux_kontext")
        processor = self.pipeline.image_processor
        multiple = 2 * self.vae_scale
        if self.reference_size == "output":
            height, width = self.height, self.width
        else:
            height, width = processor.get_default_height_width(image)
            if self.reference_size == "auto":
                ratio = width / height
                _, width, height = min((abs(ratio - w / h), w, h)
                                       for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
            height, width = height // multiple * multiple, width // multiple * multiple
        if height < multiple or width < multiple:
            raise ValueError(f"flux_kontext: a {image_size(image)} source image is smaller than "
                             f"one {multiple}x{multiple} token")
        image = processor.resize(image, height, width)
        return processor.preprocess(image, height, width)

    @torch.no_grad()
    def encode_reference(self, image: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One source image -> packed reference tokens ``[1, L_ref, 4C]`` (model dtype) and their
        rotary ids ``[L_ref, 3]`` = ``(1, row, col)``."""
        vae = self.pipeline.vae
        pixels = self.reference_pixels(image)
        vae_device = next(vae.parameters()).device
        latents = vae.encode(pixels.to(vae_device, vae.dtype)).latent_dist.mode()
        latents = (latents - vae.config.shift_factor) * vae.config.scaling_factor
        h, w = latents.shape[-2:]
        rows, cols = torch.meshgrid(torch.arange(h // 2), torch.arange(w // 2), indexing="ij")
        ids = torch.stack([torch.ones_like(rows), rows, cols], dim=-1).reshape(-1, 3)
        return (pack_latents(latents).to(self.device, self.dtype),
                ids.to(self.device, self.dtype))

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """:meth:`encode` plus each sample's source image (metadata ``"image"``) as reference
        tokens ``image_latents [B, L_ref, 4C]`` with ids ``image_ids [B, L_ref, 3]``; samples
        without a source are text-to-image."""
        cond = self.encode(prompts)
        sources = sources_of(metadata, len(prompts), "flux_kontext")
        if sources is None:
            return cond
        cond.tensors.update(gather_references(
            sources, self.encode_reference,
            "flux_kontext: the source images of one batch come out in different sizes "
            "({lengths} reference tokens); use reference_size='output' (or sources of one size)"))
        return cond

    # -- model call ---------------------------------------------------------------------------
    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, L, 4C]`` of the generated tokens; the reference tokens (if any) ride
        along after them and their outputs are dropped."""
        t = cond.tensors
        if "image_latents" not in t:
            return super().velocity(x, sigma, cond, guidance)
        b, n = x.shape[:2]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        n_train = self.pipeline.scheduler.config.num_train_timesteps
        timestep = (sigma * n_train).to(self.dtype) / n_train  # the pipeline's rounding
        g = None
        if self.pipeline.transformer.config.guidance_embeds:
            g = torch.full((b,), float(guidance), device=x.device, dtype=torch.float32)
        text_ids = torch.zeros(t["prompt_embeds"].shape[1], 3, device=x.device, dtype=self.dtype)
        ids = torch.cat([self.image_ids(x.device),
                         shared_ids(t["image_ids"], "flux_kontext").to(x.device, self.dtype)])
        hidden = torch.cat([x.to(self.dtype), t["image_latents"].to(x.device, self.dtype)], 1)
        negative = {}
        if self.true_cfg_scale > 1.0:
            negative = {"encoder_hidden_states": t["neg_prompt_embeds"],
                        "pooled_projections": t["neg_pooled"]}
        out = guided_call(
            self._model, self.true_cfg_scale,
            {"hidden_states": hidden, "timestep": timestep, "guidance": g,
             "pooled_projections": t["pooled"], "encoder_hidden_states": t["prompt_embeds"]},
            negative, txt_ids=text_ids, img_ids=ids,
        )
        return out[:, :n]
