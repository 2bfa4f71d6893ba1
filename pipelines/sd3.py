"""SD3 / SD3.5 (and the shipped digits toy) through diffusers' StableDiffusion3Pipeline.

Model units: the transformer takes ``timestep = 1000 * sigma`` (``num_train_timesteps``); the
schedule is the pipeline scheduler's own (static shift), so a rollout with the Euler sampler
reproduces ``StableDiffusion3Pipeline.__call__`` step for step.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import MMDIT_LORA_TARGETS, Cond, FlowAdapter, guided_call, load_pipeline, register


@register("sd3")
class SD3Adapter(FlowAdapter):
    """Adapter for any diffusers ``StableDiffusion3Pipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``stabilityai/stable-diffusion-3.5-medium``) or local folder.
        height, width: image size in pixels (``None``: the transformer's ``sample_size`` times the
            VAE factor, i.e. the model's native resolution).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
        negative_prompt: the unconditional prompt used for CFG.
        max_sequence_length: T5 tokens (SD3 default 256; ignored without a T5 encoder).
        pipeline: an already built ``StableDiffusion3Pipeline`` (tests, custom components).
    """

    pipeline_classes = ("StableDiffusion3Pipeline",)
    default_lora_targets = MMDIT_LORA_TARGETS

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 256,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import StableDiffusion3Pipeline

        pipeline = load_pipeline(StableDiffusion3Pipeline, "sd3", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.vae_scale = 2 ** (len(pipeline.vae.config.block_out_channels) - 1)
        native = pipeline.transformer.config.sample_size * self.vae_scale
        self.height = height or native
        self.width = width or native
        factor = self.vae_scale * pipeline.transformer.config.patch_size
        if self.height % factor or self.width % factor:
            raise ValueError(f"sd3: height and width must be multiples of {factor}")
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        pos, neg, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=True,
            negative_prompt=[self.negative_prompt] * len(prompts),
            max_sequence_length=self.max_sequence_length,
        )
        return Cond({"prompt_embeds": pos, "pooled": pooled, "neg_prompt_embeds": neg,
                     "neg_pooled": neg_pooled})

    def latent_shape(self) -> tuple[int, int, int]:
        """``(C, h, w)`` of one latent."""
        c = self.pipeline.transformer.config.in_channels
        return c, self.height // self.vae_scale, self.width // self.vae_scale

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.randn(
            (n, *self.latent_shape()), generator=generator, device=self.device, dtype=torch.float32
        )

    def schedule(self, num_steps: int) -> torch.Tensor:
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        return scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        t = cond.tensors
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        timestep = sigma * self.pipeline.scheduler.config.num_train_timesteps
        return guided_call(
            self._model, guidance,
            {"hidden_states": x.to(self.dtype), "timestep": timestep,
             "encoder_hidden_states": t["prompt_embeds"], "pooled_projections": t["pooled"]},
            {"encoder_hidden_states": t["neg_prompt_embeds"],
             "pooled_projections": t["neg_pooled"]},
        )

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        latents = x.to(vae.device, vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

