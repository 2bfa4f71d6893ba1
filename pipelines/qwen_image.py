"""Qwen-Image text-to-image through diffusers' ``QwenImagePipeline``.

Components: ``QwenImageTransformer2DModel`` (an MMDiT), ``AutoencoderKLQwenImage`` (a Wan-style
causal VAE run on one frame), a Qwen2.5-VL text encoder (its last hidden state after a chat
template whose first 34 tokens are dropped).

Latents are the transformer's token sequence, packed as FLUX packs them: the VAE latent
``[16, h, w]`` (``h = H / 8``) cut into 2x2 patches, channel-major, tokens row-major:
``[B, (h/2)(w/2), 64]`` (``[B, 4096, 64]`` at 1024x1024). The pipeline draws them as
``[B, 1, 16, h, w]`` in the text encoder's dtype and packs; :meth:`QwenImageAdapter.noise` makes
the same draw and returns it in float32.

Model units: ``timestep = sigma`` (the pipeline divides the scheduler's ``1000 * sigma``, cast to
the latents' dtype, by 1000; the adapter rounds the same way). The schedule is the pipeline's:
``linspace(1, 1/N, N)`` through the scheduler with the resolution-dependent shift
``mu = calculate_shift(L)`` (the hub scheduler uses the exponential time shift and stretches the
schedule to end at ``shift_terminal`` 0.02), then 0.

Guidance: Qwen-Image is not guidance-distilled; the ``guidance`` argument of :meth:`velocity` is
the pipeline's ``true_cfg_scale`` (4.0 is its default) against ``negative_prompt``. CFG runs the
two branches as one batched call and then rescales each token's guided velocity to the norm of
its conditional one, as the pipeline does.

Encodings: the pipeline pads prompts to the longest of the batch (the text encoder runs on the
padded batch; the transformer masks the padding). Encodings of different batches differ in length
and cannot be concatenated, so ``per_prompt_encoding`` is False: the trainer encodes a rollout's
prompts in one call. The positive and negative encodings are zero-padded to a common length with
their masks, so CFG can run them in one call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .base import MMDIT_LORA_TARGETS, Cond, FlowAdapter, load_pipeline, register
from .flux import PackedTokens, dynamic_shift_mu, pack_latents, unpack_latents


@register("qwen_image")
class QwenImageAdapter(PackedTokens, FlowAdapter):
    """Adapter for any diffusers ``QwenImagePipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``Qwen/Qwen-Image``) or local folder.
        height, width: image size in pixels, multiples of ``2 * vae_scale`` (16); ``None``: the
            pipeline's default (1024).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...); Qwen-Image is usually
            run in ``"bfloat16"``.
        negative_prompt: the negative prompt of CFG (``" "``, as in Qwen-Image's examples).
        max_sequence_length: text tokens kept after the template (512, the pipeline default;
            at most 1024).
        pipeline: an already built ``QwenImagePipeline`` (tests, custom components).
    """

    pipeline_classes = ("QwenImagePipeline",)
    # Attention projections of both streams of every block (image: to_*; text: add_*_proj,
    # to_add_out).
    default_lora_targets = MMDIT_LORA_TARGETS
    text_encoder_names = ("text_encoder",)
    per_prompt_encoding = False

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = " ",
        max_sequence_length: int = 512,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import QwenImagePipeline

        pipeline = load_pipeline(QwenImagePipeline, "qwen_image", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        if pipeline.transformer.config.guidance_embeds:
            raise ValueError("qwen_image: guidance-distilled transformers (guidance_embeds) are "
                             "unsupported; use a Qwen-Image checkpoint without them")
        self.vae_scale = pipeline.vae_scale_factor
        native = pipeline.default_sample_size * self.vae_scale
        self.height = height or native
        self.width = width or native
        factor = 2 * self.vae_scale
        if self.height % factor or self.width % factor:
            raise ValueError(f"qwen_image: height and width must be multiples of {factor}, got "
                             f"{self.height}x{self.width}")
        if not 1 <= max_sequence_length <= 1024:
            raise ValueError(f"qwen_image: max_sequence_length must be in [1, 1024], got "
                             f"{max_sequence_length}")
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length

    # -- shapes -------------------------------------------------------------------------------
    @property
    def latent_dtype(self) -> torch.dtype:
        """The dtype the pipeline keeps its latents in: its prompt embeddings' (the text
        encoder's), which also rounds the timestep."""
        encoder = self.pipeline.text_encoder
        return encoder.dtype if encoder is not None else self.dtype

    # -- interface ----------------------------------------------------------------------------
    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, mask = self.pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length)
        if mask is None:  # the pipeline drops an all-valid mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return embeds.to(self.dtype), mask

    def encode(self, prompts: list[str]) -> Cond:
        """Qwen2.5-VL ``prompt_embeds [B, T, 3584]`` and ``prompt_mask [B, T]`` (1: a token),
        with ``neg_*`` for ``negative_prompt``; both padded with zeros to one length ``T``."""
        pos, pos_mask = self._encode(prompts)
        neg, neg_mask = self._encode([self.negative_prompt] * len(prompts))
        length = max(pos.shape[1], neg.shape[1])
        pos, neg = (F.pad(e, (0, 0, 0, length - e.shape[1])) for e in (pos, neg))
        pos_mask, neg_mask = (F.pad(m, (0, length - m.shape[1])) for m in (pos_mask, neg_mask))
        return Cond({"prompt_embeds": pos, "prompt_mask": pos_mask,
                     "neg_prompt_embeds": neg, "neg_prompt_mask": neg_mask})

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Packed ``[n, L, 4C]`` float32: ``QwenImagePipeline.prepare_latents``' draw
        (``[n, 1, C, h, w]`` in the text encoder's dtype), packed."""
        from diffusers.utils.torch_utils import randn_tensor

        h, w = self.latent_grid()
        c = self.pipeline.transformer.config.in_channels // 4
        x = randn_tensor((n, 1, c, h, w), generator=generator, device=self.device,
                         dtype=self.latent_dtype)
        return pack_latents(x[:, 0].float())

    def shift_mu(self) -> float:
        """The resolution-dependent shift exponent ``mu``, linear in the token count ``L``
        (the same formula as FLUX.1's)."""
        return dynamic_shift_mu(self.pipeline.scheduler.config, self.latent_shape()[0])

    def schedule(self, num_steps: int) -> torch.Tensor:
        scheduler = self.pipeline.scheduler
        if scheduler.config.get("shift_terminal") and num_steps < 2:
            raise ValueError("qwen_image: the scheduler stretches its schedule to shift_terminal, "
                             "which needs at least 2 steps")
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=self.shift_mu())
        return scheduler.sigmas.to(torch.float32).clone()

    def _call(self, x: torch.Tensor, timestep: torch.Tensor, embeds: torch.Tensor,
              mask: torch.Tensor, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """One transformer call; ``tensors`` (the encodings of ``x``'s rows, doubled under CFG
        as ``x`` is) is for subclasses that add model inputs (the edit family's references)."""
        h, w = self.latent_grid()
        return self._model(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds,
                           encoder_hidden_states_mask=mask,
                           img_shapes=[[(1, h // 2, w // 2)]] * x.shape[0])

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, L, 4C]``; CFG (``guidance`` = ``true_cfg_scale``) above 1, with the
        pipeline's per-token rescale to the conditional velocity's norm."""
        t = cond.tensors
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        n_train = self.pipeline.scheduler.config.num_train_timesteps
        # The pipeline feeds (1000 * sigma).to(latent dtype) / 1000: same rounding here.
        timestep = (sigma * n_train).to(self.latent_dtype) / n_train
        x = x.to(self.dtype)
        if guidance <= 1.0:
            return self._call(x, timestep, t["prompt_embeds"], t["prompt_mask"], t)
        neg, pos = self._call(
            torch.cat([x, x]), torch.cat([timestep, timestep]),
            torch.cat([t["neg_prompt_embeds"], t["prompt_embeds"]]),
            torch.cat([t["neg_prompt_mask"], t["prompt_mask"]]),
            {k: torch.cat([v, v]) for k, v in t.items()},
        ).chunk(2)
        guided = neg + guidance * (pos - neg)
        scale = torch.norm(pos, dim=-1, keepdim=True) / torch.norm(guided, dim=-1, keepdim=True)
        return guided * scale

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Packed latents ``[B, L, 4C]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        latents = unpack_latents(x, *self.latent_grid())[:, :, None].to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents)
        image = vae.decode(latents / inv_std + mean, return_dict=False)[0][:, :, 0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
