"""HunyuanVideo text-to-video through diffusers' ``HunyuanVideoPipeline``.

Components: ``HunyuanVideoTransformer3DModel`` (dual- then single-stream blocks, a token refiner
over the text), ``AutoencoderKLHunyuanVideo``, a Llama text encoder (the hidden state 3 from the
end, after a prompt template whose first ``crop_start`` tokens are dropped) and CLIP-L (pooled,
77 tokens).

Latents are 5-D, ``[B, 16, F', H/8, W/8]`` with ``F' = (F - 1) / 4 + 1`` (129 frames at 720x1280 ->
``[16, 33, 90, 160]``), drawn as ``HunyuanVideoPipeline.prepare_latents`` draws them.

Model units: ``timestep = 1000 * sigma`` (float32, the latents' dtype, as the pipeline passes it).
The schedule is the pipeline's: sigmas ``linspace(1, 0, N + 1)[:-1]`` through the scheduler with
its static shift (7.0 in the hub checkpoint), then a terminal 0.

Guidance: HunyuanVideo is guidance-distilled: the ``guidance`` argument of :meth:`velocity` is
the embedded guidance scale (the pipeline's ``guidance_scale``, 6.0 by default), fed to the model
as ``1000 * g`` computed in the transformer dtype, as the pipeline does. True classifier-free
guidance (``true_cfg_scale > 1`` with ``negative_prompt``) is an option; it runs the negative and
positive branches as one batched call, both with the same guidance embedding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .base import MMDIT_LORA_TARGETS, Cond, FlowAdapter, guided_call, load_pipeline, register


@register("hunyuan_video")
class HunyuanVideoAdapter(FlowAdapter):
    """Adapter for any diffusers ``HunyuanVideoPipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``hunyuanvideo-community/HunyuanVideo``) or local folder.
        height, width: frame size in pixels, multiples of 16 (720x1280 is the pipeline default).
        num_frames: frames per video, ``4k + 1`` (129, the pipeline default).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...); HunyuanVideo is usually
            run in ``"bfloat16"``, its VAE in float16 or float32.
        true_cfg_scale: true CFG scale; ``> 1`` encodes ``negative_prompt`` too and doubles the
            batch of every model call. 1 (default) is guidance-embedding-only sampling.
        negative_prompt: the negative prompt used when ``true_cfg_scale > 1``.
        max_sequence_length: Llama tokens after the template's prefix (256, the pipeline
            default); CLIP always takes 77.
        prompt_template: ``{"template": "...{}...", "crop_start": n}`` (``None``: the
            pipeline's default template, ``crop_start`` 95).
        pipeline: an already built ``HunyuanVideoPipeline`` (tests, custom components).
    """

    modality = "video"
    pipeline_classes = ("HunyuanVideoPipeline",)
    # Attention projections of the dual-stream blocks (both streams), of the single-stream
    # blocks (to_q/k/v: they have no output projection of their own) and of the token refiner.
    default_lora_targets = MMDIT_LORA_TARGETS

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int = 720,
        width: int = 1280,
        num_frames: int = 129,
        torch_dtype: str | torch.dtype = "float32",
        true_cfg_scale: float = 1.0,
        negative_prompt: str = "",
        max_sequence_length: int = 256,
        prompt_template: dict[str, Any] | None = None,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import HunyuanVideoPipeline
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import (
            DEFAULT_PROMPT_TEMPLATE,
        )

        pipeline = load_pipeline(HunyuanVideoPipeline, "hunyuan_video", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.scale_t = pipeline.vae_scale_factor_temporal
        self.scale_s = pipeline.vae_scale_factor_spatial
        factor = math.lcm(16, self.scale_s * pipeline.transformer.config.patch_size)
        if height % factor or width % factor:
            raise ValueError(f"hunyuan_video: height and width must be multiples of {factor}, "
                             f"got {height}x{width}")
        if num_frames % self.scale_t != 1:
            raise ValueError(f"hunyuan_video: num_frames must be {self.scale_t}k + 1, got "
                             f"{num_frames}")
        if true_cfg_scale < 1.0:
            raise ValueError(f"hunyuan_video: true_cfg_scale must be >= 1 (1: off), got "
                             f"{true_cfg_scale}")
        template = DEFAULT_PROMPT_TEMPLATE if prompt_template is None else dict(prompt_template)
        if "{}" not in str(template.get("template", "")):
            raise ValueError("hunyuan_video: prompt_template needs a 'template' string with {} "
                             "where the prompt goes (and usually 'crop_start')")
        if scheduler_dynamic(pipeline.scheduler):
            raise ValueError("hunyuan_video: the scheduler uses dynamic shifting, which "
                             "HunyuanVideoPipeline cannot run; use a static shift")
        self.height, self.width, self.num_frames = height, width, num_frames
        self.true_cfg_scale = float(true_cfg_scale)
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.prompt_template = template

    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(C, F', h, w)`` of one latent."""
        frames = (self.num_frames - 1) // self.scale_t + 1
        c = self.pipeline.transformer.config.in_channels
        return c, frames, self.height // self.scale_s, self.width // self.scale_s

    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        embeds, pooled, mask = self.pipeline.encode_prompt(
            prompt=prompts, prompt_template=self.prompt_template, device=self.device,
            max_sequence_length=self.max_sequence_length,
        )
        return embeds.to(self.dtype), pooled.to(self.dtype), mask.to(self.dtype)

    def encode(self, prompts: list[str]) -> Cond:
        """Llama ``prompt_embeds [B, T, 4096]`` with its ``prompt_mask [B, T]`` (every prompt
        padded to ``max_sequence_length``: independent of the batch), CLIP ``pooled [B, 768]``;
        ``neg_*`` with true CFG."""
        embeds, pooled, mask = self._encode(prompts)
        tensors = {"prompt_embeds": embeds, "pooled": pooled, "prompt_mask": mask}
        if self.true_cfg_scale > 1.0:
            neg, neg_pooled, neg_mask = self._encode([self.negative_prompt] * len(prompts))
            tensors.update(neg_prompt_embeds=neg, neg_pooled=neg_pooled, neg_prompt_mask=neg_mask)
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, C, F', h, w]`` float32, the draw ``HunyuanVideoPipeline.prepare_latents`` makes."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (n, *self.latent_shape())
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def schedule(self, num_steps: int) -> torch.Tensor:
        sigmas = np.linspace(1.0, 0.0, num_steps + 1)[:-1]
        self.pipeline.scheduler.set_timesteps(sigmas=sigmas, device="cpu")
        return self.pipeline.scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, C, F', h, w]``; ``guidance`` is the embedded guidance scale, not CFG."""
        t = cond.tensors
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        timestep = sigma * self.pipeline.scheduler.config.num_train_timesteps
        # The pipeline: tensor([g] * B, dtype=transformer dtype) * 1000 (rounded in bf16).
        g = torch.full((b,), float(guidance), dtype=self.dtype, device=x.device) * 1000.0
        negative = {}
        if self.true_cfg_scale > 1.0:
            negative = {"encoder_hidden_states": t["neg_prompt_embeds"],
                        "encoder_attention_mask": t["neg_prompt_mask"],
                        "pooled_projections": t["neg_pooled"]}
        return guided_call(
            self._model, self.true_cfg_scale,
            {"hidden_states": x.to(self.dtype), "timestep": timestep, "guidance": g,
             "encoder_hidden_states": t["prompt_embeds"],
             "encoder_attention_mask": t["prompt_mask"], "pooled_projections": t["pooled"]},
            negative,
        )

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, F', h, w]`` -> video ``[B, F, 3, H, W]`` in [0, 1]."""
        vae = self.pipeline.vae
        latents = x.to(vae.dtype) / vae.config.scaling_factor
        video = vae.decode(latents, return_dict=False)[0]  # [B, 3, F, H, W]
        return (video.float().permute(0, 2, 1, 3, 4) / 2 + 0.5).clamp(0, 1)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the frame grid -> ``[B, 1, 1, h', w']``.

        As Wan: a latent position summarises an 8x8 pixel square of 4 frames (the first latent
        frame: frame 0 alone); the same map is applied to every latent frame and channel.
        """
        grid = F.interpolate(regions[:, None].float(), size=latents.shape[-2:], mode="area")
        return grid[:, :, None]


def scheduler_dynamic(scheduler: Any) -> bool:
    """Whether ``scheduler`` needs a ``mu`` per call (resolution-dependent shifting)."""
    return bool(getattr(scheduler.config, "use_dynamic_shifting", False))
