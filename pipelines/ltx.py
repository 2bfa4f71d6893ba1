"""LTX-Video text-to-video through diffusers' ``LTXPipeline``.

Components: ``LTXVideoTransformer3DModel`` (self- and cross-attention blocks over one token per
latent position), ``AutoencoderKLLTXVideo`` (32x spatial, 8x temporal compression, 128 channels;
LTX-Video 0.9.1 and later condition its decoder on a timestep), a T5 text encoder.

Latents are the transformer's own token sequence, as the pipeline keeps them during denoising:
the VAE latent ``[C, F', h, w]`` (``F' = (F - 1) / 8 + 1``, ``h = H / 32``) cut into
``p_t x p x p`` patches (1 for LTX-Video), each flattened channel-major into one token, tokens in
frame-major, row-major order: ``[B, L, C p_t p^2]`` with ``L = (F'/p_t)(h/p)(w/p)`` (121 frames at
480x704 -> ``[B, 16 * 15 * 22, 128]`` = ``[B, 5280, 128]``). They stay normalised (the VAE's
per-channel ``latents_mean/std``); :meth:`LTXAdapter.decode` un-normalises them as the pipeline
does.

Model units: the transformer takes ``timestep = 1000 * sigma`` (float32, the scheduler's
timesteps). The schedule is the pipeline's: sigmas ``linspace(1, 1/N, N)`` through the scheduler
with the dynamic shift ``mu = calculate_shift(F' h w)`` (the latent sequence length, as the
pipeline computes it), stretched to the scheduler's ``shift_terminal`` when it has one, then 0.

Guidance: CFG with the rollout's ``guidance`` (3.0 is the pipeline default) as one batched call on
``[negative; positive]``, combined in float32 as the pipeline does, then the optional
``guidance_rescale`` (std rescale of arXiv:2305.08891, per sample): stateless, so the velocity is a
function of ``(x, sigma, cond, guidance)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .base import Cond, FlowAdapter, load_pipeline, register


@register("ltx")
class LTXAdapter(FlowAdapter):
    """Adapter for any diffusers ``LTXPipeline`` folder or hub id (LTX-Video 2B, 13B).

    Args:
        path_or_id: hub id (``Lightricks/LTX-Video``) or local folder.
        height, width: frame size in pixels, multiples of 32 (the pipeline's check) and of the
            VAE's spatial factor times the patch size; 480x704 is the pipeline's example.
        num_frames: frames per video, ``8k + 1`` (the VAE's temporal factor; 121 here, the
            pipeline's default is 161).
        frame_rate: frames per second the rotary embedding is scaled to (25, the pipeline's
            default).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...); LTX-Video is usually run
            in ``"bfloat16"``.
        negative_prompt: the negative prompt of CFG (the pipeline's default is ``""``).
        max_sequence_length: T5 tokens (128, the pipeline default); prompts are padded to it.
        guidance_rescale: the pipeline's ``guidance_rescale`` in [0, 1] (0: off).
        decode_timestep: the timestep-conditioned decoder's timestep (LTX-Video 0.9.1 and later;
            0.05 in the diffusers docs); ignored by a VAE without ``timestep_conditioning``.
        decode_noise_scale: the share of fresh noise blended into the latents before such a
            decode (``None``: ``decode_timestep``, the pipeline's default; 0.025 in the docs).
        decode_seed: seed of that decode noise (see :meth:`decode`).
        pipeline: an already built ``LTXPipeline`` (tests, custom components).
    """

    modality = "video"
    pipeline_classes = ("LTXPipeline",)
    # Self- and cross-attention projections of every block (attn1 / attn2).
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ("text_encoder",)

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int = 480,
        width: int = 704,
        num_frames: int = 121,
        frame_rate: float = 25.0,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 128,
        guidance_rescale: float = 0.0,
        decode_timestep: float = 0.0,
        decode_noise_scale: float | None = None,
        decode_seed: int = 0,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import LTXPipeline

        pipeline = load_pipeline(LTXPipeline, "ltx", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self._video_options(
            "ltx", pipeline, height=height, width=width, num_frames=num_frames,
            frame_rate=frame_rate, negative_prompt=negative_prompt,
            max_sequence_length=max_sequence_length, decode_timestep=decode_timestep,
            decode_noise_scale=decode_noise_scale, decode_seed=decode_seed)
        if not 0.0 <= guidance_rescale <= 1.0:
            raise ValueError(f"ltx: guidance_rescale must be in [0, 1] (0: off), got "
                             f"{guidance_rescale}")
        self.guidance_rescale = float(guidance_rescale)

    def _video_options(self, family: str, pipeline: Any, *, height: int, width: int,
                       num_frames: int, frame_rate: float, negative_prompt: str,
                       max_sequence_length: int, decode_timestep: float,
                       decode_noise_scale: float | None, decode_seed: int) -> None:
        """The video geometry read from ``pipeline`` (VAE compression, patch sizes) and the options
        LTX-Video and LTX-2 share, checked with one-line errors named by ``family``."""
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"{family}: {message}")

        self.pipeline, self.transformer = pipeline, pipeline.transformer
        self.scale_s = pipeline.vae_spatial_compression_ratio
        self.scale_t = pipeline.vae_temporal_compression_ratio
        self.patch = pipeline.transformer_spatial_patch_size
        self.patch_t = pipeline.transformer_temporal_patch_size
        factor = math.lcm(32, self.scale_s * self.patch)
        step = self.scale_t * self.patch_t
        check(not (height % factor or width % factor),
              f"height and width must be multiples of {factor}, got {height}x{width}")
        check(num_frames >= 1 and (num_frames - 1) % step == 0,
              f"num_frames must be {step}k + 1, got {num_frames}")
        check(frame_rate > 0, f"frame_rate must be positive, got {frame_rate}")
        check(decode_timestep >= 0, f"decode_timestep must be >= 0, got {decode_timestep}")
        check(decode_noise_scale is None or 0.0 <= decode_noise_scale <= 1.0,
              f"decode_noise_scale must be in [0, 1] or None (None: decode_timestep), got "
              f"{decode_noise_scale}")
        self.height, self.width, self.num_frames = height, width, num_frames
        self.frame_rate = float(frame_rate)
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.decode_timestep = float(decode_timestep)
        self.decode_noise_scale = (self.decode_timestep if decode_noise_scale is None
                                   else float(decode_noise_scale))
        self.decode_seed = int(decode_seed)

    def latent_grid(self) -> tuple[int, int, int]:
        """``(F', h, w)`` of the unpacked VAE latent."""
        frames = (self.num_frames - 1) // self.scale_t + 1
        return frames, self.height // self.scale_s, self.width // self.scale_s

    def latent_shape(self) -> tuple[int, int]:
        """``(L, D)`` of one packed latent."""
        f, h, w = self.latent_grid()
        tokens = (f // self.patch_t) * (h // self.patch) * (w // self.patch)
        return tokens, self.transformer.config.in_channels

    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, mask = self.pipeline._get_t5_prompt_embeds(
            prompt=prompts, max_sequence_length=self.max_sequence_length, device=self.device)
        return embeds.to(self.dtype), mask

    def encode(self, prompts: list[str]) -> Cond:
        """T5 ``prompt_embeds [B, T, 4096]`` with the bool ``prompt_mask [B, T]`` (every prompt
        padded to ``max_sequence_length``, so independent of its batch) and the negatives."""
        embeds, mask = self._encode(prompts)
        neg, neg_mask = self._encode([self.negative_prompt] * len(prompts))
        return Cond({"prompt_embeds": embeds, "prompt_mask": mask,
                     "neg_prompt_embeds": neg, "neg_prompt_mask": neg_mask})

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Packed ``[n, L, D]`` float32: ``LTXPipeline.prepare_latents``' ``[n, C, F', h, w]`` draw,
        packed as it packs it."""
        from diffusers.utils.torch_utils import randn_tensor

        c = self.transformer.config.in_channels // (self.patch_t * self.patch ** 2)
        x = randn_tensor((n, c, *self.latent_grid()), generator=generator, device=self.device,
                         dtype=torch.float32)
        return self.pipeline._pack_latents(x, self.patch, self.patch_t)

    def shift_mu(self) -> float:
        """The dynamic-shift exponent ``mu`` from the latent sequence length ``F' h w``."""
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift

        config = self.pipeline.scheduler.config
        return calculate_shift(math.prod(self.latent_grid()),
                               config.get("base_image_seq_len", 256),
                               config.get("max_image_seq_len", 4096),
                               config.get("base_shift", 0.5), config.get("max_shift", 1.15))

    def schedule(self, num_steps: int) -> torch.Tensor:
        scheduler = self.pipeline.scheduler
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=self.shift_mu())
        return scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, L, D]`` (float32); CFG with scale ``guidance`` when it is above 1."""
        from diffusers.pipelines.ltx.pipeline_ltx import rescale_noise_cfg

        t = cond.tensors
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        timestep = sigma * self.pipeline.scheduler.config.num_train_timesteps
        embeds, mask = t["prompt_embeds"], t["prompt_mask"]
        hidden = x.to(self.dtype)
        cfg = guidance > 1.0
        if cfg:  # one batched call on [negative; positive], as the pipeline
            embeds = torch.cat([t["neg_prompt_embeds"], embeds])
            mask = torch.cat([t["neg_prompt_mask"], mask])
            hidden, timestep = torch.cat([hidden, hidden]), torch.cat([timestep, timestep])
        frames, h, w = self.latent_grid()
        v = self._model(
            hidden_states=hidden, encoder_hidden_states=embeds, timestep=timestep,
            encoder_attention_mask=mask, num_frames=frames, height=h, width=w,
            rope_interpolation_scale=(self.scale_t / self.frame_rate, self.scale_s, self.scale_s),
        ).float()
        if not cfg:
            return v
        neg, pos = v.chunk(2)
        v = neg + guidance * (pos - neg)
        if self.guidance_rescale > 0:
            v = rescale_noise_cfg(v, pos, guidance_rescale=self.guidance_rescale)
        return v

    def vae_latents(self, x: torch.Tensor) -> torch.Tensor:
        """Packed latents ``[B, L, D]`` -> the VAE's un-normalised ``[B, C, F', h, w]``."""
        vae = self.pipeline.vae
        latents = self.pipeline._unpack_latents(x, *self.latent_grid(), self.patch, self.patch_t)
        return self.pipeline._denormalize_latents(latents, vae.latents_mean, vae.latents_std,
                                                  vae.config.scaling_factor)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Packed latents ``[B, L, D]`` -> video ``[B, F, 3, H, W]`` in [0, 1].

        A timestep-conditioned VAE decodes ``(1 - n) z + n eps`` at ``decode_timestep`` with
        ``n = decode_noise_scale``, as the pipeline does. The pipeline draws ``eps`` for the
        whole batch from its generator; here each sample draws its own from a CPU generator
        seeded with ``decode_seed``, so a video decodes the same in any batch (it equals the
        pipeline's decode of a one-video batch run with that seed). A VAE that injects noise
        inside its decoder (``decoder_inject_noise``) draws it from torch's global generator, as
        in the pipeline."""
        from diffusers.utils.torch_utils import randn_tensor

        vae = self.pipeline.vae
        latents = self.vae_latents(x).to(self.dtype)
        timestep = None
        if vae.config.timestep_conditioning:
            noise = torch.cat([
                randn_tensor((1, *latents.shape[1:]),
                             generator=torch.Generator().manual_seed(self.decode_seed),
                             device=latents.device, dtype=latents.dtype)
                for _ in range(len(latents))])
            timestep = torch.full((len(latents),), self.decode_timestep, device=latents.device,
                                  dtype=latents.dtype)
            scale = torch.full_like(timestep, self.decode_noise_scale)[:, None, None, None, None]
            latents = (1 - scale) * latents + scale * noise
        video = vae.decode(latents.to(vae.dtype), timestep, return_dict=False)[0]  # [B,3,F,H,W]
        return (video.float().permute(0, 2, 1, 3, 4) / 2 + 0.5).clamp(0, 1)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the frame grid -> ``[B, L, 1]`` per-token weights.

        A token covers a ``scale_s * p`` pixel square (32x32 for LTX-Video) of ``scale_t * p_t``
        frames (the first latent frame: frame 0 alone); the map is area-averaged onto the
        ``(h/p, w/p)`` token grid, repeated for every latent frame and flattened in the packing's
        frame-major, row-major order, so it broadcasts over the token's channels."""
        frames, h, w = self.latent_grid()
        grid = F.interpolate(regions[:, None].float(), size=(h // self.patch, w // self.patch),
                             mode="area")
        return grid.expand(-1, frames // self.patch_t, -1, -1).flatten(1)[..., None]
