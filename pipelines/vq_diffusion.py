"""``vq_diffusion``: VQ-Diffusion (``microsoft/vq-diffusion-ithq``) through diffusers'
``VQDiffusionPipeline``.

The states are the VQ-VAE's codes on its latent grid, ``[B, L]`` with ``L = h * w``, over
``S = num_vector_embeds`` states: the ``K = S - 1`` codes and the mask (the last state). The
transformer predicts ``log p(x0 | x_t)`` over the codes; :meth:`VQDiffusionAdapter.logits`
returns it as ``[B, L, S]`` (the mask's column at the pipeline's ``log 0`` floor, -70) with the
pipeline's guidance (``neg + g (pos - neg)`` renormalised, the negative the learned
classifier-free embeddings) and truncation. Rollouts step with the ``vq_diffusion`` sampler
(:mod:`samplers.vq_diffusion`), the exact reverse step of the model's mask-and-replace chain,
whose tables the adapter takes from the scheduler's config (:attr:`mask_replace_schedule`).

Facts of the pipeline the family follows:

- ``VQDiffusionScheduler.set_timesteps(n)`` runs the chain's first ``n`` timesteps
  ``n - 1, ..., 0`` from all masks (no striding), so :meth:`schedule` is
  ``sigma_k = (n - k) / T``; ``n = T`` (100 for ITHQ) is the full chain.
- The transformer's ``AdaLayerNorm`` takes one timestep per call (a ``[B]`` timestep would be
  split along the batch), so :meth:`logits` calls it once per distinct noise level in a batch.
- The scheduler draws by Gumbel-argmax from ``[B, C, L]`` uniforms, not by the inverse CDF of
  one uniform per token as :class:`samplers.Categorical` does: the same generator cannot give
  the same tokens through the rollout. :func:`pipeline_tokens` is the pipeline's chain on this
  adapter (its logits, the sampler's posterior, the scheduler's draws) and reproduces its tokens.
- The embeddings' component is declared under a library diffusers no longer resolves, so the
  pipeline does not load through ``VQDiffusionPipeline.from_pretrained``; the adapter loads each
  component from its subfolder and builds the pipeline.
- The pipeline has no LoRA loader: a LoRA is saved in peft's format
  (:func:`pipelines.base.save_peft_lora`) on the attention projections of every block.
"""

from __future__ import annotations

from typing import Any

import torch

from samplers import TokenPath
from samplers.vq_diffusion import MaskReplaceSchedule, VQDiffusion, gumbel_draw, step_log_probs

from .base import Cond, PeftLoraFiles, guided_call, register
from .discrete import DiscreteAdapter

LOG_ZERO = -70.0
"""The floor the pipeline clamps ``log p(x0)`` to (its ``log 0``); the mask's logit."""

EMBEDDINGS = "learned_classifier_free_sampling_embeddings"


def truncate(log_p0: torch.Tensor, rate: float) -> torch.Tensor:
    """Keep, per token, the most probable codes until their mass reaches ``rate`` (at least the
    most probable one); the rest become ``-inf``: the pipeline's truncation, classes on dim 1.

    ``rate = 1`` (the pipeline's default) still drops the codes past the point where the float32
    running sum reaches 1."""
    ordered, order = torch.sort(log_p0, 1, descending=True)
    mass = ordered.exp().cumsum(1)
    first = torch.ones_like(mass[:, :1], dtype=torch.bool)
    keep_sorted = torch.cat([first, mass[:, :-1] < rate], 1)
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return log_p0.masked_fill(~keep, float("-inf"))


def load_vq_diffusion(path_or_id: str, dtype: torch.dtype, **kwargs: Any) -> Any:
    """A ``VQDiffusionPipeline`` from a hub id or a folder, component by component."""
    from diffusers import Transformer2DModel, VQDiffusionPipeline, VQDiffusionScheduler, VQModel
    from diffusers.pipelines.deprecated.vq_diffusion.pipeline_vq_diffusion import (
        LearnedClassifierFreeSamplingEmbeddings,
    )
    from transformers import CLIPTextModel, CLIPTokenizer

    def part(cls: Any, name: str, **extra: Any) -> Any:
        return cls.from_pretrained(path_or_id, subfolder=name, **kwargs, **extra)

    return VQDiffusionPipeline(
        vqvae=part(VQModel, "vqvae", torch_dtype=dtype),
        text_encoder=part(CLIPTextModel, "text_encoder", torch_dtype=dtype),
        tokenizer=part(CLIPTokenizer, "tokenizer"),
        transformer=part(Transformer2DModel, "transformer", torch_dtype=dtype),
        scheduler=part(VQDiffusionScheduler, "scheduler"),
        learned_classifier_free_sampling_embeddings=part(
            LearnedClassifierFreeSamplingEmbeddings, EMBEDDINGS, torch_dtype=dtype),
    )


@register("vq_diffusion")
class VQDiffusionAdapter(PeftLoraFiles, DiscreteAdapter):
    """Adapter for a diffusers ``VQDiffusionPipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``microsoft/vq-diffusion-ithq``) or local folder.
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
        truncation_rate: the pipeline's truncation of ``p(x0)`` (1: its default).
        pipeline: an already built ``VQDiffusionPipeline`` (tests, custom components).
    """

    pipeline_classes = ("VQDiffusionPipeline",)
    default_sampler = "vq_diffusion"
    text_encoder_names = ("text_encoder",)

    def __init__(self, path_or_id: str | None = None, *,
                 torch_dtype: str | torch.dtype = "float32", truncation_rate: float = 1.0,
                 pipeline: Any = None, **from_pretrained_kwargs: Any) -> None:
        if pipeline is None:
            if path_or_id is None:
                raise ValueError("vq_diffusion needs a hub id or a local folder "
                                 "(or a built `pipeline`)")
            dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
            pipeline = load_vq_diffusion(str(path_or_id), dtype, **from_pretrained_kwargs)
        if not 0.0 < truncation_rate <= 1.0:
            raise ValueError(f"vq_diffusion truncation_rate must be in (0, 1]; got "
                             f"{truncation_rate}")
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.truncation_rate = float(truncation_rate)
        states = int(self.transformer.config.num_vector_embeds)
        self.token_shape = (int(self.transformer.height), int(self.transformer.width))
        self.path = TokenPath("masked", states, mask_id=states - 1)
        config = pipeline.scheduler.config
        if config.num_vec_classes != states:
            raise ValueError(f"vq_diffusion: the scheduler has {config.num_vec_classes} classes; "
                             f"the transformer {states}")
        self.mask_replace_schedule = MaskReplaceSchedule.linear(
            states, config.num_train_timesteps, config.alpha_cum_start, config.alpha_cum_end,
            config.gamma_cum_start, config.gamma_cum_end)

    @property
    def num_train_timesteps(self) -> int:
        return self.mask_replace_schedule.num_timesteps

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """The pipeline's text embeddings (CLIP's last hidden states, each normalised) and its
        negatives (the learned classifier-free embeddings, or the empty prompt's), per sample.

        A prompt longer than the tokenizer's ``model_max_length`` is truncated (the pipeline
        truncates its ids too, but a batch with such a prompt fails in its tokenizer call)."""
        pos = self._text(list(prompts))
        learned = self.pipeline.learned_classifier_free_sampling_embeddings
        if learned.learnable:
            neg = learned.embeddings.detach().to(pos).unsqueeze(0).expand(len(prompts), -1, -1)
        else:
            neg = self._text([""] * len(prompts))
        return Cond({"prompt_embeds": pos, "neg_prompt_embeds": neg.contiguous()})

    def _text(self, prompts: list[str]) -> torch.Tensor:
        tokenizer = self.pipeline.tokenizer
        ids = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids
        encoder = self.pipeline.text_encoder
        hidden = encoder(ids.to(encoder.device))[0]
        return (hidden / hidden.norm(dim=-1, keepdim=True)).to(self.dtype)

    def schedule(self, num_steps: int) -> torch.Tensor:
        """``[(n - k) / T for k = 0..n]``: the pipeline runs the chain's first ``n`` timesteps."""
        steps = self.num_train_timesteps
        if not 1 <= num_steps <= steps:
            raise ValueError(f"vq_diffusion runs 1 to {steps} steps (the chain's timesteps); "
                             f"got {num_steps}")
        return torch.arange(num_steps, -1, -1, dtype=torch.float32) / steps

    def timesteps(self, sigma: torch.Tensor) -> torch.Tensor:
        """The chain's timestep ``t`` of the state at each noise level, ``sigma = (t + 1) / T``."""
        steps = self.num_train_timesteps
        t = torch.round(sigma.double() * steps).long() - 1
        return t.clamp(0, steps - 1)

    def logits(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
               guidance: float) -> torch.Tensor:
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1).expand(x.shape[0])
        t = self.timesteps(sigma.cpu())
        out = None
        for value in torch.unique(t).tolist():
            rows = (t == value).nonzero().flatten().to(x.device)
            part = self._log_p0(x[rows], value, cond.index(rows), guidance)
            if out is None:
                out = part.new_empty((x.shape[0], *part.shape[1:]))
            out[rows] = part
        return out

    def _log_p0(self, x: torch.Tensor, t: int, cond: Cond, guidance: float) -> torch.Tensor:
        """``[B, L, S]``: the pipeline's ``log p(x0)`` at one timestep (guided, renormalised,
        truncated, floored at ``log 0``) with the mask's column appended."""
        embeds = cond.tensors
        timestep = torch.tensor(t, dtype=torch.long, device=x.device)
        out = guided_call(
            self._model, guidance,
            {"hidden_states": x.long(), "encoder_hidden_states": embeds["prompt_embeds"]},
            {"encoder_hidden_states": embeds["neg_prompt_embeds"]}, timestep=timestep,
        ).float()
        if guidance > 1.0:
            out = out - torch.logsumexp(out, dim=1, keepdim=True)
        out = truncate(out, self.truncation_rate).clamp(LOG_ZERO)
        mask = out.new_full((out.shape[0], 1, out.shape[2]), LOG_ZERO)
        return torch.cat([out, mask], 1).transpose(1, 2)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, L]`` -> images ``[B, 3, H, W]`` in [0, 1], as the pipeline decodes (a mask,
        which a finished sample has none of, shows as the last code)."""
        vqvae = self.pipeline.vqvae
        codes = x.long().clamp_max(self.path.num_states - 2).to(vqvae.device)
        shape = (x.shape[0], *self.token_shape, vqvae.config.vq_embed_dim)
        embeddings = vqvae.quantize.get_codebook_entry(codes, shape=shape)
        image = vqvae.decode(embeddings, force_not_quantize=True).sample
        return (image.float() / 2 + 0.5).clamp(0, 1)


@torch.no_grad()
def pipeline_tokens(adapter: VQDiffusionAdapter, prompts: list[str], num_steps: int,
                    guidance: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[B, L]`` the pipeline's sampling on the adapter: from all masks, each step the adapter's
    logits, the ``vq_diffusion`` sampler's step logarithms and the scheduler's Gumbel-argmax
    draw from ``generator``, so the same generator gives ``VQDiffusionPipeline``'s tokens (the
    rollout draws the same distributions by the inverse CDF instead; module docstring)."""
    sampler = VQDiffusion().bind(adapter)
    cond = adapter.encode(prompts)
    sigmas = adapter.schedule(num_steps)
    x = adapter.noise(len(prompts))
    for k in range(num_steps):
        logits = adapter.logits(x, sigmas[k].expand(x.shape[0]), cond, guidance)
        t = sampler.timestep(float(sigmas[k]), float(sigmas[k + 1]))
        logp = step_log_probs(logits[..., :-1], x, t, sampler.schedule)
        x = gumbel_draw(logp, generator)
    return x
