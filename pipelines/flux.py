"""FLUX.1 (dev, schnell) through diffusers' ``FluxPipeline``.

Latents are the transformer's own token sequence: the VAE latent ``[C, h, w]`` (``h = H / 8``) cut
into 2x2 patches, each patch flattened channel-major into one token, tokens in row-major patch
order, giving ``[B, L, 4C]`` with ``L = (h/2)(w/2)`` (``[B, 4096, 64]`` at 1024x1024). Keeping
the packed form means samplers, log-probs and KL see exactly what the model sees and nothing is
re-packed per step; :meth:`FluxAdapter.position_weights` maps region maps onto these tokens.

Model units: the transformer takes ``timestep = sigma`` (the pipeline divides the scheduler's
``1000 * sigma`` by 1000, after casting to the latent dtype; this adapter does the same cast, so
bf16 runs round the timestep as the pipeline does). The schedule is the pipeline's: sigmas
``linspace(1, 1/N, N)`` through the scheduler with the resolution-dependent shift
``mu = calculate_shift(L)`` (FLUX.1's dynamic shift), then a terminal 0.

Guidance: FLUX.1-dev is guidance-distilled: the ``guidance`` argument of :meth:`velocity` is the
value fed to the guidance embedding (3.5 is the dev default; ignored by schnell, which has no
embedding). True classifier-free guidance (``true_cfg_scale > 1`` with ``negative_prompt``) is an
option; it runs the negative and positive branches as one batched call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .base import MMDIT_LORA_TARGETS, Cond, FlowAdapter, guided_call, load_pipeline, register


def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` VAE latents -> ``[B, (h/2)(w/2), 4C]`` tokens (2x2 patches, row-major)."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`pack_latents`: ``[B, L, 4C]`` -> ``[B, C, h, w]``."""
    b, _, c4 = x.shape
    x = x.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, h, w)


def dynamic_shift_mu(config: Any, tokens: int) -> float:
    """The resolution-dependent shift exponent ``mu`` of FLUX.1 and Qwen-Image: linear in the
    image token count, from the scheduler config's ``base/max_image_seq_len`` and
    ``base/max_shift`` (diffusers' ``calculate_shift``)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return calculate_shift(tokens, config.get("base_image_seq_len", 256),
                           config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                           config.get("max_shift", 1.15))


class PackedTokens:
    """The geometry of latents packed as FLUX packs them (2x2 patches of the VAE latent, one
    token each, row-major), shared by FLUX.1 and Qwen-Image: an adapter with ``height``,
    ``width`` (pixels), ``vae_scale`` and a transformer whose ``in_channels`` is ``4C``."""

    height: int
    width: int
    vae_scale: int

    def latent_grid(self) -> tuple[int, int]:
        """``(h, w)`` of the unpacked VAE latent (pixels / vae_scale)."""
        return self.height // self.vae_scale, self.width // self.vae_scale

    def latent_shape(self) -> tuple[int, int]:
        """``(L, 4C)`` of one packed latent."""
        h, w = self.latent_grid()
        return (h // 2) * (w // 2), self.pipeline.transformer.config.in_channels

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the image grid -> ``[B, L, 1]`` per-token weights.

        A token is a 2x2 patch of VAE latents, i.e. a ``2*vae_scale`` pixel square (16x16 for
        FLUX.1 and Qwen-Image); the map is area-averaged onto the ``(h/2, w/2)`` token grid and
        flattened in the packing's row-major order, so it broadcasts over the token's ``4C``
        channels.
        """
        h, w = self.latent_grid()
        grid = F.interpolate(regions[:, None].float(), size=(h // 2, w // 2), mode="area")
        return grid.flatten(1)[..., None]


@register("flux")
class FluxAdapter(PackedTokens, FlowAdapter):
    """Adapter for any diffusers ``FluxPipeline`` folder or hub id (FLUX.1-dev / -schnell).

    Args:
        path_or_id: hub id (``black-forest-labs/FLUX.1-dev``) or local folder.
        height, width: image size in pixels, multiples of ``2 * vae_scale`` (16 for FLUX.1);
            ``None``: the pipeline's default (1024).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ``"float16"``); FLUX.1 is
            usually run in ``"bfloat16"``.
        true_cfg_scale: true CFG scale; ``> 1`` encodes ``negative_prompt`` too and doubles the
            batch of every model call. 1 (default) is FLUX's guidance-embedding-only sampling.
        negative_prompt: the negative prompt used when ``true_cfg_scale > 1``.
        max_sequence_length: T5 tokens (512 for dev, 256 is the schnell recipe).
        pipeline: an already built ``FluxPipeline`` (tests, custom components).
    """

    # Attention projections of both streams, as in common FLUX LoRA recipes (the single-stream
    # blocks' to_q/k/v match ``attn.to_*`` too; they have no output projection of their own).
    pipeline_classes = ("FluxPipeline",)
    default_lora_targets = MMDIT_LORA_TARGETS

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        torch_dtype: str | torch.dtype = "float32",
        true_cfg_scale: float = 1.0,
        negative_prompt: str = "",
        max_sequence_length: int = 512,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import FluxPipeline

        pipeline = load_pipeline(FluxPipeline, "flux", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.vae_scale = pipeline.vae_scale_factor
        native = pipeline.default_sample_size * self.vae_scale
        self.height = height or native
        self.width = width or native
        factor = 2 * self.vae_scale
        if self.height % factor or self.width % factor:
            raise ValueError(f"flux: height and width must be multiples of {factor}")
        if true_cfg_scale < 1.0:
            raise ValueError(f"flux: true_cfg_scale must be >= 1 (1: off), got {true_cfg_scale}")
        self.true_cfg_scale = float(true_cfg_scale)
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length

    # -- interface ----------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """T5 ``prompt_embeds [B, T, 4096]``, CLIP ``pooled [B, 768]`` (``neg_*`` with true CFG)."""
        embeds, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device,
            max_sequence_length=self.max_sequence_length,
        )
        tensors = {"prompt_embeds": embeds, "pooled": pooled}
        if self.true_cfg_scale > 1.0:
            neg, neg_pooled, _ = self.pipeline.encode_prompt(
                prompt=[self.negative_prompt] * len(prompts), prompt_2=None, device=self.device,
                max_sequence_length=self.max_sequence_length,
            )
            tensors.update(neg_prompt_embeds=neg, neg_pooled=neg_pooled)
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Packed ``[n, L, 4C]`` float32: ``FluxPipeline``'s ``[n, C, h, w]`` draw, packed."""
        from diffusers.utils.torch_utils import randn_tensor

        h, w = self.latent_grid()
        c = self.pipeline.transformer.config.in_channels // 4
        x = randn_tensor((n, c, h, w), generator=generator, device=self.device, dtype=torch.float32)
        return pack_latents(x)

    def shift_mu(self) -> float:
        """FLUX.1's dynamic-shift exponent ``mu``, linear in the image token count ``L``."""
        return dynamic_shift_mu(self.pipeline.scheduler.config, self.latent_shape()[0])

    def schedule(self, num_steps: int) -> torch.Tensor:
        scheduler = self.pipeline.scheduler
        if getattr(scheduler.config, "use_flow_sigmas", False):
            scheduler.set_timesteps(num_steps, device="cpu", mu=self.shift_mu())
        else:
            sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
            scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=self.shift_mu())
        return scheduler.sigmas.to(torch.float32).clone()

    def image_ids(self, device: torch.device) -> torch.Tensor:
        """``[L, 3]`` rotary position ids of the image tokens: ``(0, row, col)`` per patch."""
        h, w = self.latent_grid()
        rows, cols = torch.meshgrid(torch.arange(h // 2), torch.arange(w // 2), indexing="ij")
        ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3)
        return ids.to(device=device, dtype=self.dtype)

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, L, 4C]``; ``guidance`` is the guidance-embedding value (dev), not CFG."""
        t = cond.tensors
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        n_train = self.pipeline.scheduler.config.num_train_timesteps
        # The pipeline feeds (1000 * sigma).to(latent dtype) / 1000: same rounding here.
        timestep = (sigma * n_train).to(self.dtype) / n_train
        g = None
        if self.pipeline.transformer.config.guidance_embeds:
            g = torch.full((b,), float(guidance), device=x.device, dtype=torch.float32)
        text_ids = torch.zeros(t["prompt_embeds"].shape[1], 3, device=x.device, dtype=self.dtype)
        negative = {}
        if self.true_cfg_scale > 1.0:
            negative = {"encoder_hidden_states": t["neg_prompt_embeds"],
                        "pooled_projections": t["neg_pooled"]}
        return guided_call(
            self._model, self.true_cfg_scale,
            {"hidden_states": x.to(self.dtype), "timestep": timestep, "guidance": g,
             "pooled_projections": t["pooled"], "encoder_hidden_states": t["prompt_embeds"]},
            negative, txt_ids=text_ids, img_ids=self.image_ids(x.device),
        )

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Packed latents ``[B, L, 4C]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        latents = unpack_latents(x, *self.latent_grid()).to(vae.dtype)
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
