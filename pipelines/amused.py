"""``amused``: aMUSEd (``amused/amused-256``, ``amused/amused-512``) through diffusers'
``AmusedPipeline``.

The states are the VQ-GAN's codes on its latent grid, ``[B, L]`` with ``L = h * w``. The
transformer (``UVit2DModel``) embeds a vocabulary of ``vocab_size`` ids whose last is the mask
(``mask_token_id``; 8256 ids for 8192 codes in the released models) and predicts logits over the
``codebook_size`` codes only. The family's token path is the masked path over
``S = mask_token_id + 1`` states: :meth:`AmusedAdapter.logits` returns ``[B, L, S]`` with the
codes' logits and :data:`LOG_ZERO` (probability 0) for every other id, the mask included, with
the pipeline's guidance ``uncond + g (cond - uncond)`` on the logits (no renormalisation), the
negative the empty prompt's.

Facts of the pipeline the family follows:

- The transformer takes no timestep: it reads the noise level from the masks in its input, so
  :meth:`~AmusedAdapter.logits` ignores ``sigma``. It is conditioned on CLIP's pooled projection
  (``text_embeds``), its penultimate hidden states and five micro-conditions
  ``[width, height, crop top, crop left, aesthetic score]`` (defaults: the image size, 0, 0, 6).
- ``AmusedScheduler`` masks, after step ``i`` of ``n``, the fraction ``cos(pi/2 (i + 1) / n)``
  of the tokens (``1 - (i + 1) / n`` with its linear schedule), and ``add_noise`` masks each
  token independently with that probability. :meth:`~AmusedAdapter.schedule` is that fraction as
  the noise level, ``sigma_k = cos(pi/2 k / n)``, so :meth:`~AmusedAdapter.corrupt` is
  ``add_noise`` (the same uniforms give the same masks).
- The scheduler's step is MaskGIT's: draw every masked token from the posterior, then re-mask
  the ``floor(L sigma_{k+1})`` drawn tokens of lowest confidence (log-probability plus annealed
  Gumbel noise, temperature 2 -> 0). That top-k over the whole image has no closed-form
  probability, so a rollout steps with the ``ctmc`` sampler instead: each masked token unmasks
  independently with probability ``(sigma_k - sigma_{k+1}) / sigma_k`` to a posterior draw, the
  same number of masks in expectation, with an exact per-token log-probability (the policy the
  ratio, the KL and dFlowGRPO need). The objectives that score the final image through the
  forward process (``udm_grpo``: MaskGRPO's remasking, the one-shot mask) use no step
  probability at all. :func:`pipeline_tokens` is the pipeline's own sampling on the adapter's
  logits, for comparing the two samplers and for parity.
- The pipeline has no LoRA loader: a LoRA is saved in peft's format
  (:func:`pipelines.base.save_peft_lora`) on the attention projections of every block.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from samplers import TokenPath

from .base import Cond, PeftLoraFiles, guided_call, load_pipeline, register
from .discrete import DiscreteAdapter

LOG_ZERO = -1.0e4
"""The logit of every id that is not a code (the mask, the unused ids): ``exp`` underflows to 0
in float32, so these states have probability exactly 0 and stay finite under ``log_softmax``."""


@register("amused")
class AmusedAdapter(PeftLoraFiles, DiscreteAdapter):
    """Adapter for a diffusers ``AmusedPipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``amused/amused-256``, ``amused/amused-512``) or local folder.
        height, width: image size in pixels, a multiple of the VQ-GAN's downsampling (default:
            the transformer's ``sample_size`` times it, the pipeline's default).
        aesthetic_score: the micro-condition on aesthetics (the pipeline's default 6).
        crop_coord: the micro-condition on the crop's top-left corner (default ``(0, 0)``).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
        pipeline: an already built ``AmusedPipeline`` (tests, custom components).
    """

    pipeline_classes = ("AmusedPipeline",)
    text_encoder_names = ("text_encoder",)

    def __init__(self, path_or_id: str | None = None, *, height: int | None = None,
                 width: int | None = None, aesthetic_score: float = 6.0,
                 crop_coord: tuple[int, int] | list[int] = (0, 0),
                 torch_dtype: str | torch.dtype = "float32", pipeline: Any = None,
                 **from_pretrained_kwargs: Any) -> None:
        from diffusers import AmusedPipeline

        pipeline = load_pipeline(AmusedPipeline, "amused", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        config = self.transformer.config
        factor = int(pipeline.vae_scale_factor)
        height = int(height or config.sample_size * factor)
        width = int(width or config.sample_size * factor)
        if height % factor or width % factor:
            raise ValueError(f"amused height and width must be multiples of {factor} (the "
                             f"VQ-GAN's downsampling); got {height}x{width}")
        if len(crop_coord) != 2:
            raise ValueError(f"amused crop_coord is (top, left); got {crop_coord!r}")
        self.height, self.width = height, width
        self.token_shape = (height // factor, width // factor)
        self.aesthetic_score = float(aesthetic_score)
        self.crop_coord = (int(crop_coord[0]), int(crop_coord[1]))
        mask_id = int(pipeline.scheduler.config.mask_token_id)
        if not config.codebook_size <= mask_id < config.vocab_size:
            raise ValueError(f"amused: the scheduler's mask_token_id {mask_id} must be an id "
                             f"past the {config.codebook_size} codes, below the transformer's "
                             f"vocab_size {config.vocab_size}")
        self.codebook_size = int(config.codebook_size)
        self.path = TokenPath("masked", mask_id + 1, mask_id=mask_id)
        self.masking_schedule = str(pipeline.scheduler.config.masking_schedule)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """CLIP's pooled projection and penultimate hidden states per prompt, and the empty
        prompt's as the negatives (the pipeline's encoding)."""
        pooled, hidden = self._text(list(prompts))
        neg_pooled, neg_hidden = self._text([""] * len(prompts))
        return Cond({"pooled_text_emb": pooled, "encoder_hidden_states": hidden,
                     "neg_pooled_text_emb": neg_pooled, "neg_encoder_hidden_states": neg_hidden})

    def _text(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tokenizer = self.pipeline.tokenizer
        ids = tokenizer(prompts, return_tensors="pt", padding="max_length", truncation=True,
                        max_length=tokenizer.model_max_length).input_ids
        encoder = self.pipeline.text_encoder
        out = encoder(ids.to(encoder.device), return_dict=True, output_hidden_states=True)
        return out.text_embeds, out.hidden_states[-2]

    def schedule(self, num_steps: int) -> torch.Tensor:
        """``sigma_k = cos(pi/2 k / n)`` (``1 - k / n`` for the linear schedule): the fraction of
        tokens the pipeline leaves masked after ``k`` of ``n`` steps, ending at exactly 0."""
        if num_steps < 1:
            raise ValueError(f"amused needs at least 1 step; got {num_steps}")
        ratio = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
        if self.masking_schedule == "cosine":
            sigmas = torch.cos(ratio * math.pi / 2)
        elif self.masking_schedule == "linear":
            sigmas = 1.0 - ratio
        else:
            raise ValueError(f"amused: unknown masking_schedule {self.masking_schedule!r} in the "
                             f"scheduler's config; valid: cosine, linear")
        sigmas[-1] = 0.0
        return sigmas.float()

    def micro_conds(self, batch: int) -> torch.Tensor:
        """``[batch, 5]``: width, height, crop top, crop left, aesthetic score (the pipeline's
        order, width first)."""
        values = [self.width, self.height, *self.crop_coord, self.aesthetic_score]
        return torch.tensor(values, device=self.device, dtype=self.dtype).expand(batch, -1)

    def logits(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
               guidance: float) -> torch.Tensor:
        """``[B, L, S]``: the codes' logits (guided as the pipeline guides), then ``LOG_ZERO``
        for the other ids; ``sigma`` is not an input of the model (module docstring)."""
        embeds = cond.tensors
        grid = x.long().reshape(x.shape[0], *self.token_shape)
        out = guided_call(
            self.transformer, guidance,
            {"input_ids": grid, "encoder_hidden_states": embeds["encoder_hidden_states"],
             "pooled_text_emb": embeds["pooled_text_emb"],
             "micro_conds": self.micro_conds(x.shape[0])},
            {"encoder_hidden_states": embeds["neg_encoder_hidden_states"],
             "pooled_text_emb": embeds["neg_pooled_text_emb"]},
        ).float()
        codes = out.reshape(x.shape[0], self.codebook_size, -1).transpose(1, 2)
        rest = codes.new_full((*codes.shape[:2], self.path.num_states - self.codebook_size),
                              LOG_ZERO)
        return torch.cat([codes, rest], -1)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, L]`` -> images ``[B, 3, H, W]`` in [0, 1], as the pipeline decodes (an id
        that is not a code, which a finished sample has none of, shows as the last code)."""
        vqvae = self.pipeline.vqvae
        codes = x.long().clamp_max(self.codebook_size - 1).to(vqvae.device)
        codes = codes.reshape(x.shape[0], *self.token_shape)
        shape = (x.shape[0], *self.token_shape, vqvae.config.latent_channels)
        image = vqvae.decode(codes, force_not_quantize=True, shape=shape).sample
        return image.float().clamp(0, 1)


@torch.no_grad()
def pipeline_tokens(adapter: AmusedAdapter, prompts: list[str], num_steps: int,
                    guidance: float, generator: torch.Generator | None = None,
                    temperature: float | tuple[float, float] = (2.0, 0.0)) -> torch.Tensor:
    """``[B, L]`` the pipeline's MaskGIT sampling on the adapter: from all masks, each step the
    adapter's logits of the codes and ``AmusedScheduler.step`` with ``generator``, so the same
    generator gives ``AmusedPipeline``'s tokens (rollouts step with ``ctmc``; module
    docstring)."""
    scheduler = adapter.pipeline.scheduler
    scheduler.set_timesteps(num_steps, temperature, adapter.device)
    cond = adapter.encode(prompts)
    x = adapter.noise(len(prompts))
    sigma = torch.ones(len(prompts))
    for timestep in scheduler.timesteps:
        logits = adapter.logits(x, sigma, cond, guidance)[..., :adapter.codebook_size]
        grid = logits.transpose(1, 2).reshape(len(prompts), -1, *adapter.token_shape)
        x = scheduler.step(grid, timestep, x.reshape(len(prompts), *adapter.token_shape),
                           generator=generator).prev_sample.reshape(len(prompts), -1)
    return x
