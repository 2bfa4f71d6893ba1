"""Wan2.1 text-to-video through diffusers' ``WanPipeline``.

Components: ``WanTransformer3DModel``, ``AutoencoderKLWan``, a UMT5 text encoder.

Latents are 5-D, ``[B, C, F', h, w]``: ``F' = (F - 1) / 4 + 1`` latent frames (the causal VAE keeps
the first frame and compresses the rest 4x in time) and ``h, w = H / 8, W / 8``; Wan2.1 has
``C = 16`` (81 frames at 480x832 -> ``[16, 21, 60, 104]``).

Model units: the transformer takes ``timestep = 1000 * sigma`` (float32, as the pipeline passes
the scheduler's timesteps). The schedule is flow-matching Euler with the checkpoint's flow shift:
the pipeline scheduler's own sigmas when it is a ``FlowMatchEulerDiscreteScheduler``; hub
checkpoints ship ``UniPCMultistepScheduler`` (a multistep solver, not a per-step transition), so
its ``flow_shift`` (3.0 for 480p, 5.0 for 720p) configures an Euler scheduler instead. With the
Euler sampler a rollout reproduces ``WanPipeline.__call__`` run with that Euler scheduler.
CFG (``guidance > 1``) runs the negative and positive branches as one batched call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .base import Cond, FlowAdapter, guided_call, load_pipeline, register


@register("wan")
class WanAdapter(FlowAdapter):
    """Adapter for any diffusers ``WanPipeline`` (Wan2.1 T2V 1.3B / 14B) folder or hub id.

    Args:
        path_or_id: hub id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``) or local folder.
        height, width: frame size in pixels, multiples of ``vae_scale * patch`` (16).
        num_frames: frames per video, ``4k + 1`` (81 is Wan2.1's default, 5 s at 16 fps).
        torch_dtype: weights dtype of the pipeline (``"float32"``, ``"bfloat16"``, ...). Wan's
            recipe keeps the VAE in float32; pass ``vae=...`` through ``from_pretrained_kwargs``.
        negative_prompt: the negative prompt used for CFG (Wan's recipes use a long one).
        max_sequence_length: UMT5 tokens (512, the pipeline default).
        flow_shift: the Euler schedule's shift; ``None`` takes the pipeline scheduler's.
        pipeline: an already built ``WanPipeline`` (tests, custom components).
    """

    modality = "video"
    # Self- and cross-attention projections of every block (attn1 / attn2), the usual Wan LoRA.
    pipeline_classes = ("WanPipeline",)
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int = 480,
        width: int = 832,
        num_frames: int = 81,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 512,
        flow_shift: float | None = None,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

        pipeline = load_pipeline(WanPipeline, "wan", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        if pipeline.transformer_2 is not None or pipeline.config.expand_timesteps:
            raise ValueError("wan: Wan2.2 two-expert or per-token-timestep pipelines: unsupported")
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.scale_t = pipeline.vae_scale_factor_temporal
        self.scale_s = pipeline.vae_scale_factor_spatial
        factor = self.scale_s * self.pipeline.transformer.config.patch_size[1]
        if height % factor or width % factor:
            raise ValueError(f"wan: height and width must be multiples of {factor}")
        if num_frames % self.scale_t != 1:
            raise ValueError(f"wan: num_frames must be {self.scale_t}k + 1, got {num_frames}")
        self.height, self.width, self.num_frames = height, width, num_frames
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        scheduler = pipeline.scheduler
        if flow_shift is None and isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
            self.scheduler = scheduler
        else:
            shift = flow_shift if flow_shift is not None else scheduler.config.get("flow_shift")
            if shift is None:
                raise ValueError("wan: the pipeline's scheduler has no flow shift; pass flow_shift")
            self.scheduler = FlowMatchEulerDiscreteScheduler(
                num_train_timesteps=scheduler.config.num_train_timesteps, shift=float(shift)
            )

    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(C, F', h, w)`` of one latent."""
        frames = (self.num_frames - 1) // self.scale_t + 1
        c = self.pipeline.transformer.config.in_channels
        return c, frames, self.height // self.scale_s, self.width // self.scale_s

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """UMT5 ``prompt_embeds [B, T, 4096]`` (zero-padded after the tokens) and the negatives."""
        pos, neg = self.pipeline.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=True,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return Cond({"prompt_embeds": pos.to(self.dtype), "neg_prompt_embeds": neg.to(self.dtype)})

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, C, F', h, w]`` float32, the draw ``WanPipeline.prepare_latents`` makes."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (n, *self.latent_shape())
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def schedule(self, num_steps: int) -> torch.Tensor:
        self.scheduler.set_timesteps(num_steps, device="cpu")
        return self.scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, C, F', h, w]``; CFG with scale ``guidance`` when it is above 1."""
        t = cond.tensors
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        timestep = sigma * self.scheduler.config.num_train_timesteps
        return guided_call(
            self._model, guidance,
            {"hidden_states": x.to(self.dtype), "timestep": timestep,
             "encoder_hidden_states": t["prompt_embeds"]},
            {"encoder_hidden_states": t["neg_prompt_embeds"]},
        )

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, F', h, w]`` -> video ``[B, F, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        latents = x.to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]  # [B, 3, F, H, W]
        return (video.float().permute(0, 2, 1, 3, 4) / 2 + 0.5).clamp(0, 1)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the frame grid -> ``[B, 1, 1, h', w']``.

        A latent position summarises a ``vae_scale`` pixel square (8x8) of 4 frames (the first
        latent frame: frame 0 alone); the same map is applied to every latent frame and channel.
        """
        grid = F.interpolate(regions[:, None].float(), size=latents.shape[-2:], mode="area")
        return grid[:, :, None]

