"""Wan2.1 and Wan2.2 text-to-video through diffusers' ``WanPipeline``.

Components: ``WanTransformer3DModel`` (two of them for Wan2.2 A14B), ``AutoencoderKLWan``, a UMT5
text encoder.

Latents are 5-D, ``[B, C, F', h, w]``: ``F' = (F - 1) / 4 + 1`` latent frames (the causal VAE keeps
the first frame and compresses the rest 4x in time) and ``h, w = H / s, W / s`` with the VAE's
spatial factor ``s``. Wan2.1 and Wan2.2 A14B: ``C = 16``, ``s = 8`` (81 frames at 480x832 ->
``[16, 21, 60, 104]``). Wan2.2 TI2V-5B: its residual VAE patches 2x2 pixels before downsampling
8x, so ``s = 16``, and ``C = 48`` (121 frames at 704x1280 -> ``[48, 31, 44, 80]``).

Model units: the transformer takes ``timestep = 1000 * sigma`` (float32, as the pipeline passes
the scheduler's timesteps). Wan2.2 TI2V (``expand_timesteps``) takes it per token,
``[B, F' (h/2) (w/2)]``, every token of a text-to-video sample at the same value, as the pipeline
builds it. The schedule is flow-matching Euler with the checkpoint's flow shift: the pipeline
scheduler's own sigmas when it is a ``FlowMatchEulerDiscreteScheduler``; hub checkpoints ship
``UniPCMultistepScheduler`` (a multistep solver, not a per-step transition), so its
``flow_shift`` configures an Euler scheduler instead. With the Euler sampler a rollout reproduces
``WanPipeline.__call__`` run with that Euler scheduler.

Wan2.2 A14B has two experts: ``transformer`` (high noise) runs where
``1000 * sigma >= boundary_ratio * 1000`` (``boundary_ratio`` from the pipeline config, 0.875),
``transformer_2`` (low noise) below, exactly the pipeline's test on its timestep; so the velocity
stays a function of ``(x, sigma)``. The LoRA trains one expert (``lora_expert``); the other stays
frozen. CFG (``guidance > 1``) runs the negative and positive branches as one batched call; the
low-noise expert uses ``guidance_scale_2`` when it is set, as the pipeline does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .base import Cond, FlowAdapter, guided_call, load_pipeline, register

LORA_EXPERT_FILE = "wan_lora_expert.json"
"""Written beside a two-expert pipeline's LoRA: which expert it belongs to (``{"expert": ...}``)."""


@register("wan")
class WanAdapter(FlowAdapter):
    """Adapter for any diffusers ``WanPipeline`` folder or hub id: Wan2.1 T2V 1.3B / 14B, Wan2.2
    TI2V-5B (text-to-video, per-token timesteps) and Wan2.2 T2V-A14B (two experts).

    Args:
        path_or_id: hub id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``) or local folder.
        height, width: frame size in pixels, multiples of ``vae_scale * patch`` (16; 32 for
            Wan2.2 TI2V-5B).
        num_frames: frames per video, ``4k + 1`` (81 is Wan2.1's default, 5 s at 16 fps).
        torch_dtype: weights dtype of the pipeline (``"float32"``, ``"bfloat16"``, ...). Wan's
            recipe keeps the VAE in float32; pass ``vae=...`` through ``from_pretrained_kwargs``.
        negative_prompt: the negative prompt used for CFG (Wan's recipes use a long one).
        max_sequence_length: UMT5 tokens (512, the pipeline default).
        flow_shift: the Euler schedule's shift; ``None`` takes the pipeline scheduler's.
        guidance_scale_2: two-expert pipelines only: the CFG scale of the low-noise expert
            (``None``: the rollout's ``guidance``, the pipeline's default). As in the pipeline,
            a rollout with ``guidance <= 1`` runs no CFG in either stage.
        lora_expert: two-expert pipelines only: the expert that is :attr:`transformer`, i.e.
            the one the LoRA (or full fine-tuning) trains: ``"high"`` (``transformer``, the
            high-noise expert; the default, loaded by a plain ``load_lora_weights``) or ``"low"``
            (``transformer_2``; diffusers loads it with ``load_into_transformer_2=True``).
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
        guidance_scale_2: float | None = None,
        lora_expert: str = "high",
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

        pipeline = load_pipeline(WanPipeline, "wan", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        if pipeline.transformer is None:
            raise ValueError("wan: the pipeline has no `transformer`; a pipeline with only "
                             "`transformer_2` is unsupported")
        self.boundary_ratio = pipeline.config.get("boundary_ratio")
        two_experts = self.boundary_ratio is not None
        if two_experts and pipeline.transformer_2 is None:
            raise ValueError(f"wan: boundary_ratio is {self.boundary_ratio} but the pipeline has "
                             "no `transformer_2` (the low-noise expert)")
        if lora_expert not in ("high", "low"):
            raise ValueError(f"wan: lora_expert must be 'high' or 'low', got {lora_expert!r}")
        if lora_expert == "low" and not two_experts:
            raise ValueError("wan: lora_expert 'low' needs a two-expert pipeline (Wan2.2 A14B: "
                             "`transformer_2` and `boundary_ratio`)")
        if guidance_scale_2 is not None and not two_experts:
            raise ValueError("wan: guidance_scale_2 needs a two-expert pipeline (Wan2.2 A14B); "
                             "leave it unset")
        if guidance_scale_2 is not None and guidance_scale_2 < 1.0:
            raise ValueError(f"wan: guidance_scale_2 must be >= 1 (1: no CFG in the low-noise "
                             f"stage), got {guidance_scale_2}")
        self.pipeline = pipeline
        self.lora_expert = lora_expert if two_experts else "high"
        self.guidance_scale_2 = None if guidance_scale_2 is None else float(guidance_scale_2)
        self.expand_timesteps = bool(pipeline.config.get("expand_timesteps", False))
        high, low = pipeline.transformer, pipeline.transformer_2 if two_experts else None
        # `transformer` is the trained expert (the trainer may wrap or swap it); `frozen_expert`
        # is the other one (None: a single-expert pipeline), never trained.
        self.transformer = low if self.lora_expert == "low" else high
        self.frozen_expert = high if self.lora_expert == "low" else low
        if self.frozen_expert is not None:
            self.frozen_expert.requires_grad_(False).eval()
        self.scale_t = pipeline.vae_scale_factor_temporal
        self.scale_s = pipeline.vae_scale_factor_spatial
        self.patch = tuple(high.config.patch_size)
        factor = self.scale_s * self.patch[1]
        if height % factor or width % factor:
            raise ValueError(f"wan: height and width must be multiples of {factor}, got "
                             f"{height}x{width}")
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

    @property
    def two_experts(self) -> bool:
        """Whether this is a two-expert (Wan2.2 A14B) pipeline."""
        return self.boundary_ratio is not None

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

    def high_noise(self, sigma: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: which samples the high-noise expert (``transformer``) denoises; all of
        them in a single-expert pipeline. The pipeline's test ``t >= boundary_ratio * 1000``."""
        n_train = self.scheduler.config.num_train_timesteps
        timestep = torch.as_tensor(sigma, dtype=torch.float32) * n_train
        if not self.two_experts:
            return torch.ones_like(timestep, dtype=torch.bool)
        return timestep >= self.boundary_ratio * n_train

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, C, F', h, w]``; CFG with scale ``guidance`` when it is above 1.

        Two experts: each sample goes to the expert of its sigma (one call per expert present
        in the batch); the low-noise one guides with ``guidance_scale_2`` when it is set."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        if not self.two_experts:
            return self._expert_velocity(True, x, sigma, cond, guidance)
        high = self.high_noise(sigma)
        if bool(high.all()) or not bool(high.any()):
            return self._expert_velocity(bool(high[0]), x, sigma, cond, guidance)
        parts, order = [], []
        for is_high in (True, False):  # a batch that straddles the boundary: one call each
            idx = torch.nonzero(high == is_high).flatten()
            parts.append(self._expert_velocity(is_high, x[idx], sigma[idx], cond.index(idx),
                                               guidance))
            order.append(idx)
        return torch.cat(parts)[torch.argsort(torch.cat(order))]

    def _expert_velocity(self, is_high: bool, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
                         guidance: float) -> torch.Tensor:
        trained = is_high == (self.lora_expert == "high")
        model = self.transformer if trained else self.frozen_expert
        if not is_high and self.guidance_scale_2 is not None and guidance > 1.0:
            guidance = self.guidance_scale_2
        t = cond.tensors
        timestep = sigma * self.scheduler.config.num_train_timesteps
        if self.expand_timesteps:  # one timestep per token: [B, F'/p_t * h/p_h * w/p_w]
            tokens = math.prod(n // p for n, p in zip(x.shape[2:], self.patch, strict=True))
            timestep = timestep[:, None].expand(-1, tokens)
        return guided_call(
            lambda **inputs: model(**inputs, return_dict=False)[0], guidance,
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

    def save_lora(self, directory: str, lora_state_dict: dict[str, torch.Tensor],
                  metadata: dict[str, Any] | None = None) -> None:
        """diffusers' ``save_lora_weights``; a two-expert pipeline's folder also names its expert
        (``wan_lora_expert.json``), which :meth:`load_lora` checks."""
        super().save_lora(directory, lora_state_dict, metadata)
        if self.two_experts:
            note = {"expert": self.lora_expert,
                    "load_into_transformer_2": self.lora_expert == "low"}
            (Path(directory) / LORA_EXPERT_FILE).write_text(json.dumps(note, indent=2))

    def load_lora(self, directory: str) -> None:
        """Load the LoRA into the trained expert, :attr:`transformer` (the low-noise one is
        ``transformer_2``, which ``load_lora_weights`` reaches with
        ``load_into_transformer_2=True``); refuses a folder written for the other expert."""
        note = Path(directory) / LORA_EXPERT_FILE
        if note.is_file():
            expert = json.loads(note.read_text()).get("expert")
            if expert != self.lora_expert:
                raise ValueError(f"wan: {directory} holds a LoRA of the {expert}-noise expert; "
                                 f"set lora_expert: {expert}")
        if hasattr(self.transformer, "load_lora_adapter"):
            super().load_lora(directory)
        else:
            self.pipeline.load_lora_weights(directory,
                                            load_into_transformer_2=self.lora_expert == "low")

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the frame grid -> ``[B, 1, 1, h', w']``.

        A latent position summarises a ``vae_scale`` pixel square (8x8; 16x16 for Wan2.2
        TI2V-5B) of 4 frames (the first latent frame: frame 0 alone); the same map is applied to
        every latent frame and channel.
        """
        grid = F.interpolate(regions[:, None].float(), size=latents.shape[-2:], mode="area")
        return grid[:, :, None]
