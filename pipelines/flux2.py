"""FLUX.2 [klein] (text-to-image and multi-reference editing) through diffusers'
``Flux2KleinPipeline``.

Components: ``Flux2Transformer2DModel`` (double- and single-stream blocks, 4-axis rotary ids),
``AutoencoderKLFlux2`` (8x downsampling, 32 latent channels, a batch-norm over the 2x2-patchified
latents), a Qwen3 text encoder whose hidden states of three layers (9, 18, 27 on the hub models)
are stacked into the prompt embedding after a chat template.

Latents: the VAE latent ``[C, h, w]`` (``h = H / 8``) patchified 2x2 (channel-major, then the
2x2 offsets) into ``[4C, h/2, w/2]``, normalised by the VAE's batch-norm statistics, and
flattened row-major into tokens ``[B, (h/2)(w/2), 4C]`` (``[B, 4096, 128]`` at 1024x1024): what
the transformer consumes. The pipeline draws ``[B, 4C, h/2, w/2]`` noise in the text encoder's
dtype and flattens it; :meth:`Flux2KleinAdapter.noise` makes the same draw (float32 result).
:meth:`Flux2KleinAdapter.vae_latents` undoes the normalisation and patchification (the
pipeline's ``output_type="latent"`` result).

Model units: ``timestep = sigma`` (``1000 * sigma`` in the latents' dtype, / 1000, as the
pipeline), no guidance embedding (``guidance=None``). The schedule is the pipeline's:
``linspace(1, 1/N, N)`` through the scheduler with ``mu = compute_empirical_mu(L, N)``, a shift
that depends on the token count AND the step count, then 0.

Guidance: the base (non-distilled) models use CFG against the empty prompt, one batched call;
``guidance`` is the pipeline's ``guidance_scale`` (4.0 in its examples). The step-distilled
models (``is_distilled`` in ``model_index.json``) have no CFG: ``guidance`` must be 1 there (the
pipeline ignores ``guidance_scale`` with a warning; the adapter refuses it).

References: each sample's metadata ``"image"`` (a path, a PIL image, a ``[3, h, w]`` tensor in
[0, 1], or a list of them for several references) is VAE-encoded (posterior mode),
batch-norm-normalised, patchified and flattened like the latents; the reference tokens follow
the generated ones with rotary ids ``(10 (i + 1), row, col, 0)`` for the ``i``-th reference and
the model's output is cut back to the generated tokens. Without a reference a sample is plain
text-to-image. Samplers, log-probs, KLs and region maps only ever see the generated tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from flowgrpo.validation import one_of

from .base import MMDIT_LORA_TARGETS, Cond, FlowAdapter, guided_call, load_pipeline, register
from .flux_kontext import gather_references, load_source_image, shared_ids, sources_of

REFERENCE_SIZES = ("output", "source")
MAX_REFERENCE_AREA = 1024 * 1024  # the pipeline scales larger references down to this area


def patch_tokens(x: torch.Tensor) -> torch.Tensor:
    """``[B, C', h', w']`` patchified latents -> ``[B, h' w', C']`` tokens (row-major)."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).permute(0, 2, 1)


def token_grid(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`patch_tokens`: ``[B, h w, C']`` -> ``[B, C', h, w]``."""
    return x.permute(0, 2, 1).reshape(x.shape[0], x.shape[2], h, w)


def to_pil(image: Any) -> Any:
    """A ``[1, 3, h, w]`` tensor in [0, 1] -> an 8-bit RGB PIL image (the pipeline takes PIL
    references only); PIL images pass through."""
    import PIL.Image

    if not isinstance(image, torch.Tensor):
        return image
    pixels = (image[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return PIL.Image.fromarray(pixels)


@register("flux2_klein")
class Flux2KleinAdapter(FlowAdapter):
    """Adapter for any diffusers ``Flux2KleinPipeline`` folder or hub id (FLUX.2 [klein] 4B/9B,
    base or distilled).

    Args:
        path_or_id: hub id (``black-forest-labs/FLUX.2-klein-base-4B``) or local folder.
        height, width: size of the generated image in pixels, multiples of ``2 * vae_scale``
            (16); ``None``: 1024.
        reference_size: how a reference is sized, with the pipeline's own preprocessing:
            ``"output"`` (default): scaled (LANCZOS, keeping its aspect ratio) to cover
            ``height x width`` and center-cropped to it, so every reference of a batch has the
            generated image's token count (a reference of exactly that size is used as is,
            as in the pipeline);
            ``"source"``: the pipeline's rule: its own size (scaled down to 1024^2 pixels when
            larger), center-cropped to multiples of 16; the references of one batch must then
            come out the same size.
        torch_dtype: weights dtype (``"bfloat16"`` is the usual).
        negative_prompt: the CFG negative (the pipeline always uses ``""``).
        max_sequence_length: text tokens (512, the pipeline default).
        text_encoder_out_layers: the Qwen3 hidden states stacked into the prompt embedding
            (``(9, 18, 27)``, the pipeline default).
        pipeline: an already built ``Flux2KleinPipeline`` (tests, custom components).
    """

    pipeline_classes = ("Flux2KleinPipeline",)
    # attention of both streams: the double-stream blocks' projections, and the single-stream
    # blocks' fused qkv+MLP input projection (their fused output projection is named
    # ``attn.to_out`` like the double-stream ModuleList, so a suffix cannot select it alone)
    default_lora_targets = (*MMDIT_LORA_TARGETS, "attn.to_qkv_mlp_proj")
    # the VAE encodes the references next to the text encoder (offloaded with it)
    text_encoder_names = ("text_encoder", "vae")
    condition_keys = ("image",)

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        reference_size: str = "output",
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 512,
        text_encoder_out_layers: tuple[int, ...] | list[int] = (9, 18, 27),
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import Flux2KleinPipeline

        one_of("flux2_klein: reference_size", reference_size, REFERENCE_SIZES)
        pipeline = load_pipeline(Flux2KleinPipeline, "flux2_klein", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.vae_scale = pipeline.vae_scale_factor
        native = pipeline.default_sample_size * self.vae_scale
        self.height, self.width = height or native, width or native
        factor = 2 * self.vae_scale
        if self.height % factor or self.width % factor:
            raise ValueError(f"flux2_klein: height and width must be multiples of {factor}, got "
                             f"{self.height} x {self.width}")
        layers = tuple(int(k) for k in text_encoder_out_layers)
        n_layers = pipeline.text_encoder.config.num_hidden_layers
        if not layers or not all(0 <= k <= n_layers for k in layers):
            raise ValueError(f"flux2_klein: text_encoder_out_layers must be hidden-state indices "
                             f"in 0..{n_layers}, got {list(text_encoder_out_layers)}")
        self.reference_size = reference_size
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.text_encoder_out_layers = layers
        self.is_distilled = bool(pipeline.config.get("is_distilled", False))

    # -- shapes -------------------------------------------------------------------------------
    def token_grid_size(self) -> tuple[int, int]:
        """``(h/2, w/2)``: the generated image's token grid (pixels / (2 vae_scale))."""
        return self.height // (2 * self.vae_scale), self.width // (2 * self.vae_scale)

    def latent_ids(self, device: torch.device) -> torch.Tensor:
        """``[L, 4]`` rotary ids of the generated tokens: ``(0, row, col, 0)``."""
        h, w = self.token_grid_size()
        return torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w),
                                    torch.arange(1)).to(device)

    # -- encodings ----------------------------------------------------------------------------
    def _prompt_embeds(self, prompts: list[str]) -> torch.Tensor:
        embeds, _ = self.pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )
        return embeds

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """Qwen3 ``prompt_embeds [B, T, 3 D]`` (and ``neg_prompt_embeds`` of the negative
        unless the model is distilled): text-to-image."""
        tensors = {"prompt_embeds": self._prompt_embeds(list(prompts))}
        if not self.is_distilled:
            negatives = [self.negative_prompt] * len(prompts)
            tensors["neg_prompt_embeds"] = self._prompt_embeds(negatives)
        return Cond(tensors)

    def reference_pixels(self, image: Any) -> torch.Tensor:
        """One reference (path, PIL image or tensor in [0, 1]) -> ``[1, 3, h, w]`` in [-1, 1]:
        the pipeline's checks (at least 64 px a side, aspect ratio at most 8) and
        preprocessing (center crop to multiples of 16), at the size :attr:`reference_size`
        gives."""
        import PIL.Image

        image = to_pil(load_source_image(image, "flux2_klein"))
        processor = self.pipeline.image_processor
        try:
            processor.check_image_input(image)
        except ValueError as err:
            raise ValueError(f"flux2_klein: reference image: {err}") from None
        if self.reference_size == "output":
            height, width = self.height, self.width
            scale = max(height / image.height, width / image.width)
            size = (max(width, round(image.width * scale)),
                    max(height, round(image.height * scale)))
            if size != image.size:
                image = image.resize(size, PIL.Image.Resampling.LANCZOS)
        else:
            if image.width * image.height > MAX_REFERENCE_AREA:
                image = processor._resize_to_target_area(image, MAX_REFERENCE_AREA)
            multiple = 2 * self.vae_scale
            height = image.height // multiple * multiple
            width = image.width // multiple * multiple
        return processor.preprocess(image, height=height, width=width, resize_mode="crop")

    @torch.no_grad()
    def encode_reference(self, image: Any) -> torch.Tensor:
        """One reference -> its normalised patchified VAE latents ``[1, 4C, h/2, w/2]``."""
        vae = self.pipeline.vae
        pixels = self.reference_pixels(image)
        vae_device = next(vae.parameters()).device
        latents = vae.encode(pixels.to(vae_device, vae.dtype)).latent_dist.mode()
        latents = self.pipeline._patchify_latents(latents)
        mean, std = self._bn_stats(latents)
        return (latents - mean) / std

    def _bn_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE batch-norm's running mean and std ``[1, 4C, 1, 1]`` (as the pipeline)."""
        vae = self.pipeline.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        return mean, std.to(like.device, like.dtype)

    def encode_references(self, images: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample's reference(s) -> tokens ``[1, L_ref, 4C]`` (model dtype) and rotary ids
        ``[L_ref, 4]``: the ``i``-th reference's tokens get time coordinate ``10 (i + 1)``."""
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if not images:
            raise ValueError("flux2_klein: an empty list of reference images")
        tokens, ids = [], []
        for i, image in enumerate(images):
            latents = self.encode_reference(image)
            h, w = latents.shape[-2:]
            tokens.append(patch_tokens(latents))
            ids.append(torch.cartesian_prod(torch.tensor([10 * (i + 1)]), torch.arange(h),
                                            torch.arange(w), torch.arange(1)))
        return (torch.cat(tokens, 1).to(self.device, self.dtype),
                torch.cat(ids).to(self.device))

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """:meth:`encode` plus each sample's reference(s) (metadata ``"image"``): tokens
        ``image_latents [B, L_ref, 4C]`` and ids ``image_ids [B, L_ref, 4]``. Samples without
        a reference are text-to-image."""
        cond = self.encode(prompts)
        sources = sources_of(metadata, len(prompts), "flux2_klein")
        if sources is None:
            return cond
        cond.tensors.update(gather_references(
            sources, self.encode_references,
            "flux2_klein: the references of one batch differ in number or size ({lengths} "
            "tokens); use reference_size='output' and the same number of references per sample"))
        return cond

    # -- sampling -----------------------------------------------------------------------------
    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens ``[n, L, 4C]`` float32: the pipeline's ``[n, 4C, h/2, w/2]`` draw (in the
        text encoder's dtype, as the pipeline draws it), flattened."""
        from diffusers.utils.torch_utils import randn_tensor

        h, w = self.token_grid_size()
        c = self.pipeline.transformer.config.in_channels
        encoder = getattr(self.pipeline, "text_encoder", None)
        dtype = encoder.dtype if encoder is not None else self.dtype
        x = randn_tensor((n, c, h, w), generator=generator, device=self.device, dtype=dtype)
        return patch_tokens(x).float()

    def schedule(self, num_steps: int) -> torch.Tensor:
        """The pipeline's sigmas for ``num_steps``: shift ``mu = compute_empirical_mu(L, N)``."""
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

        h, w = self.token_grid_size()
        mu = compute_empirical_mu(image_seq_len=h * w, num_steps=num_steps)
        scheduler = self.pipeline.scheduler
        if getattr(scheduler.config, "use_flow_sigmas", False):
            scheduler.set_timesteps(num_steps, device="cpu", mu=mu)
        else:
            sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
            scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=mu)
        return scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, L, 4C]`` of the generated tokens; ``guidance`` is the CFG scale
        (base models; must be <= 1 for distilled ones)."""
        if guidance > 1.0 and self.is_distilled:
            raise ValueError(f"flux2_klein: this model is step-distilled (no CFG): run it with "
                             f"guidance 1, got {guidance}")
        t = cond.tensors
        b, n = x.shape[:2]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        n_train = self.pipeline.scheduler.config.num_train_timesteps
        timestep = (sigma * n_train).to(self.dtype) / n_train  # the pipeline's rounding
        embeds = t["prompt_embeds"]
        text_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                                        torch.arange(embeds.shape[1])).to(x.device)
        hidden, ids = x.to(self.dtype), self.latent_ids(x.device)
        if "image_latents" in t:
            hidden = torch.cat([hidden, t["image_latents"].to(x.device, self.dtype)], 1)
            ids = torch.cat([ids, shared_ids(t["image_ids"], "flux2_klein").to(x.device)])
        negative = {}
        if guidance > 1.0:
            negative = {"encoder_hidden_states": t["neg_prompt_embeds"]}
        out = guided_call(
            self._model, guidance,
            {"hidden_states": hidden, "timestep": timestep, "encoder_hidden_states": embeds},
            negative, guidance=None, txt_ids=text_ids, img_ids=ids,
        )
        return out[:, :n]

    # -- decoding -----------------------------------------------------------------------------
    def vae_latents(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, L, 4C]`` -> VAE latents ``[B, C, h, w]`` (batch-norm undone,
        unpatchified): the pipeline's ``output_type="latent"`` result."""
        latents = token_grid(x, *self.token_grid_size())
        mean, std = self._bn_stats(latents)
        return self.pipeline._unpatchify_latents(latents * std + mean)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, L, 4C]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        image = vae.decode(self.vae_latents(x.to(vae.dtype)), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the image grid -> ``[B, L, 1]`` per-token weights.

        A token is a 2x2 patch of VAE latents, a ``2 * vae_scale`` pixel square (16x16); the map
        is area-averaged onto the ``(H/16, W/16)`` token grid and flattened row-major. Only the
        generated tokens are latents; reference tokens get no weight because they are not part
        of the latents at all."""
        grid = F.interpolate(regions[:, None].float(), size=self.token_grid_size(), mode="area")
        return grid.flatten(1)[..., None]

