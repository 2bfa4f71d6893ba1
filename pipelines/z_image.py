"""Z-Image (base and Turbo) text-to-image through diffusers' ``ZImagePipeline``.

Components: ``ZImageTransformer2DModel`` (a single-stream DiT: image and caption tokens in one
sequence), ``AutoencoderKL`` (FLUX's 16-channel VAE), a Qwen3 text encoder (its second-to-last
hidden state after a chat template, masked tokens dropped).

Latents are the VAE's ``[B, C, H/8, W/8]`` grid, unpacked; the transformer patchifies them 2x2
itself. Its call takes LISTS: one ``[C, 1, h, w]`` latent and one ``[T_i, D]`` caption per
sample (each caption its own length, no padding), and returns a list. The adapter keeps the
batch as tensors (captions zero-padded to ``max_sequence_length`` with their lengths in the
encoding) and rebuilds the lists for each call.

Model units, converted in :meth:`ZImageAdapter.velocity`:

- time runs the other way: the pipeline feeds ``(1000 - 1000 sigma) / 1000 = 1 - sigma``
  (1 is clean data), which the transformer multiplies by its ``t_scale`` (1000);
- the model predicts ``x0 - eps``: the pipeline negates it before the Euler step. The adapter
  returns the negated output, flowgrpo's ``v ~ eps - x0``.

Schedule: the pipeline's, ``linspace(1, 1/N, N)`` through the scheduler with ``mu`` from the
image token count (used only when the scheduler shifts dynamically; Z-Image-Turbo's ships a static
``shift`` 3.0), then 0.

Guidance: the pipeline writes CFG as ``pos + g (pos - neg)`` and runs it when ``g > 0``; flowgrpo's
``guidance`` is the usual ``neg + s (pos - neg)``, so ``s = 1 + g``: the pipeline's
``guidance_scale`` 4 is our ``guidance`` 5, and Z-Image-Turbo's ``guidance_scale`` 0 (no CFG) is
our 1. The pipeline's ``cfg_normalization`` (cap the guided prediction's norm at that multiple of
the conditional one's) and ``cfg_truncation`` (no CFG once ``1 - sigma`` exceeds it) are options.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .base import Cond, FlowAdapter, load_pipeline, register
from .flux import dynamic_shift_mu


@register("z_image")
class ZImageAdapter(FlowAdapter):
    """Adapter for any diffusers ``ZImagePipeline`` folder or hub id (Z-Image, Z-Image-Turbo).

    Args:
        path_or_id: hub id (``Tongyi-MAI/Z-Image-Turbo``, ``Tongyi-MAI/Z-Image``) or local folder.
        height, width: image size in pixels, multiples of ``2 * vae_scale`` (16); ``None``: 1024,
            the pipeline's default.
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...).
        negative_prompt: the negative prompt of CFG (``""``, the pipeline's default).
        max_sequence_length: tokens of a prompt after the chat template (512, the pipeline's
            default); longer prompts are cut, as the pipeline cuts them.
        cfg_normalization: the pipeline's renormalisation: under CFG, a sample's guided
            prediction is scaled down to at most this multiple of its conditional prediction's
            norm; 0 (the pipeline's ``False``, default): off.
        cfg_truncation: CFG runs only while ``1 - sigma <= cfg_truncation`` (the pipeline's
            rule); 1 (default): at every step.
        pipeline: an already built ``ZImagePipeline`` (tests, custom components).
    """

    pipeline_classes = ("ZImagePipeline",)
    # The attention projections of every block (noise refiner, context refiner, main layers):
    # Z-Image has one attention per block, named like diffusers' other transformers.
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ("text_encoder",)
    # Every prompt is padded to max_sequence_length before the text encoder (the pipeline's
    # tokenizer call), and only its own tokens reach the transformer: encodings are per prompt.
    per_prompt_encoding = True

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 512,
        cfg_normalization: float = 0.0,
        cfg_truncation: float = 1.0,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import ZImagePipeline

        pipeline = load_pipeline(ZImagePipeline, "z_image", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.vae_scale = pipeline.vae_scale_factor
        self.height = height or 1024
        self.width = width or 1024
        factor = 2 * self.vae_scale
        if self.height % factor or self.width % factor:
            raise ValueError(f"z_image: height and width must be multiples of {factor}, got "
                             f"{self.height}x{self.width}")
        if max_sequence_length < 1:
            raise ValueError(f"z_image: max_sequence_length must be at least 1, got "
                             f"{max_sequence_length}")
        if cfg_normalization < 0:
            raise ValueError(f"z_image: cfg_normalization must be >= 0 (0: off), got "
                             f"{cfg_normalization}")
        if not 0.0 <= cfg_truncation <= 1.0:
            raise ValueError(f"z_image: cfg_truncation must be in [0, 1] (1: CFG at every step), "
                             f"got {cfg_truncation}")
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.cfg_normalization = float(cfg_normalization)
        self.cfg_truncation = float(cfg_truncation)

    # -- shapes -------------------------------------------------------------------------------
    def latent_grid(self) -> tuple[int, int]:
        """``(h, w)`` of the VAE latent: ``prepare_latents``' ``2 * (H // (2 vae_scale))``."""
        factor = 2 * self.vae_scale
        return 2 * (self.height // factor), 2 * (self.width // factor)

    # -- interface ----------------------------------------------------------------------------
    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, max_sequence_length, D]`` (each prompt's own tokens, then zeros) and ``[B]``
        lengths. ``encode_prompt`` rewrites the list it is given (the chat template): a copy."""
        embeds, _ = self.pipeline.encode_prompt(
            prompt=list(prompts), device=self.device, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length)
        lengths = torch.tensor([len(e) for e in embeds], dtype=torch.long, device=self.device)
        padded = torch.stack([F.pad(e, (0, 0, 0, self.max_sequence_length - len(e)))
                              for e in embeds])
        return padded.to(self.dtype), lengths

    def encode(self, prompts: list[str]) -> Cond:
        """Qwen3 ``prompt_embeds [B, max_sequence_length, D]`` with ``prompt_length [B]``, and
        ``neg_*`` for ``negative_prompt``."""
        pos, pos_len = self._encode(prompts)
        neg, neg_len = self._encode([self.negative_prompt] * len(prompts))
        return Cond({"prompt_embeds": pos, "prompt_length": pos_len,
                     "neg_prompt_embeds": neg, "neg_prompt_length": neg_len})

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, C, h, w]`` float32: ``ZImagePipeline.prepare_latents``' draw."""
        from diffusers.utils.torch_utils import randn_tensor

        h, w = self.latent_grid()
        c = self.transformer.config.in_channels
        return randn_tensor((n, c, h, w), generator=generator, device=self.device,
                            dtype=torch.float32)

    def shift_mu(self) -> float:
        """The pipeline's ``mu`` from the image token count ``(h/2)(w/2)``; a scheduler without
        ``use_dynamic_shifting`` (Z-Image-Turbo's) ignores it and applies its static shift."""
        h, w = self.latent_grid()
        return dynamic_shift_mu(self.pipeline.scheduler.config, (h // 2) * (w // 2))

    def schedule(self, num_steps: int) -> torch.Tensor:
        scheduler = self.pipeline.scheduler
        # the pipeline's default sigmas, as it builds them (float32 linspace, then floats)
        sigmas = torch.linspace(1.0, 1 / num_steps, num_steps).tolist()
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=self.shift_mu())
        return scheduler.sigmas.to(torch.float32).clone()

    def _call(self, x: torch.Tensor, timestep: torch.Tensor, embeds: torch.Tensor,
              lengths: torch.Tensor) -> torch.Tensor:
        """One transformer call on the batch as lists (latent ``[C, 1, h, w]`` and caption
        ``[T_i, D]`` per sample); the raw model output, stacked back to ``[B, C, h, w]``."""
        captions = [e[:n] for e, n in zip(embeds, lengths.tolist(), strict=True)]
        out = self._model(x=list(x.unsqueeze(2).unbind(0)), t=timestep, cap_feats=captions)
        return torch.stack(out).squeeze(2)

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, C, h, w]``: minus the model's output at time ``1 - sigma``.

        Converted from the pipeline's conventions (see the module docstring): the model is fed
        ``t = (1000 - 1000 sigma) / 1000`` (the pipeline's arithmetic on the scheduler's
        ``1000 sigma``, so the rounding is the same) and predicts ``x0 - eps``, which the
        pipeline negates before ``scheduler.step``; the negation is returned. ``guidance > 1``
        runs CFG ``neg + guidance (pos - neg)`` (the pipeline's ``guidance_scale`` is
        ``guidance - 1``) in one call ordered ``[pos; neg]`` as the pipeline's, on the samples
        whose ``1 - sigma`` is within ``cfg_truncation``, with ``cfg_normalization``."""
        t = cond.tensors
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        n_train = self.pipeline.scheduler.config.num_train_timesteps
        timestep = (n_train - sigma * n_train) / n_train
        x = x.to(self.dtype)
        guided = guidance > 1.0
        if guided and self.cfg_truncation < 1.0:
            on = timestep <= self.cfg_truncation  # the pipeline's rule, per sample
            guided = bool(on.any())
        if not guided:
            return -self._call(x, timestep, t["prompt_embeds"], t["prompt_length"])
        both = self._call(
            torch.cat([x, x]), torch.cat([timestep, timestep]),
            torch.cat([t["prompt_embeds"], t["neg_prompt_embeds"]]),
            torch.cat([t["prompt_length"], t["neg_prompt_length"]]),
        ).float()
        pos, neg = both.chunk(2)
        pred = pos + (guidance - 1.0) * (pos - neg)
        if self.cfg_normalization > 0:
            pos_norm = torch.linalg.vector_norm(pos.flatten(1), dim=1)
            pred_norm = torch.linalg.vector_norm(pred.flatten(1), dim=1)
            cap = pos_norm * self.cfg_normalization
            scale = torch.where(pred_norm > cap, cap / pred_norm, torch.ones_like(pred_norm))
            pred = pred * scale.view(-1, *[1] * (pred.dim() - 1))
        if self.cfg_truncation < 1.0:
            pred = torch.where(on.view(-1, *[1] * (pred.dim() - 1)), pred, pos)
        return -pred

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, h, w]`` -> images ``[B, 3, H, W]`` in [0, 1] (the pipeline's
        ``latents / scaling_factor + shift_factor`` through the VAE)."""
        vae = self.pipeline.vae
        latents = x.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
