"""ACE-Step 1.5 text-to-music through diffusers' ``AceStepPipeline``.

Why this audio family: of diffusers' flow-matching text-to-audio pipelines (ACE-Step,
LongCat-AudioDiT, Stable Audio 3), ACE-Step is the open music generator with the widest use
(songs with lyrics, community LoRAs, turbo checkpoints in common UIs), and the only one whose
pipeline has a LoRA loader (``AceStepLoraLoaderMixin``), so a trained adapter loads back with
``pipe.load_lora_weights`` like every other family here.

Latents are ``[B, T, D]``: ``T = ceil(seconds * 25)`` latent frames (48 kHz audio, 1920x
downsampling) of ``D = 64`` acoustic channels, time-major as the DiT consumes them.

Model units: the DiT takes ``timestep = sigma`` (the scheduler has ``num_train_timesteps = 1``)
for both of its time inputs (``t`` and ``r = t``). The schedule is the pipeline's: ``linspace(1, 0,
N+1)`` warped by ``shift * s / (1 + (shift - 1) s)`` (3.0 by default), the terminal 0 kept.

Guidance: turbo checkpoints have guidance distilled in and take ``guidance = 1``. Base/SFT
checkpoints guide against the learned null condition (``null_condition_emb``) in one batched call,
with ACE-Step's adaptive projected guidance (APG: the guidance update is clipped to norm 2.5 over
time and only its component orthogonal to the conditional prediction is kept) or plain CFG. The
pipeline's APG also keeps a momentum average of the update *across steps*; a velocity that depends
on earlier steps is not a function of ``(x, sigma)`` and cannot be replayed per step, so this
adapter's APG is the stateless one (momentum 0). It equals the pipeline run with momentum 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from flowgrpo.validation import one_of

from .base import Cond, FlowAdapter, load_pipeline, register

GUIDANCE_MODES = ("apg", "cfg")


@register("ace_step")
class AceStepAdapter(FlowAdapter):
    """Adapter for any diffusers ``AceStepPipeline`` folder or hub id (text-to-music task).

    Args:
        path_or_id: hub id (``ACE-Step/acestep-v15-xl-turbo-diffusers``) or local folder.
        audio_duration: seconds of audio per sample (sets the latent length).
        lyrics: lyrics for every prompt (``""``: instrumental); the prompt is the caption.
        vocal_language, bpm, keyscale, timesignature: the metadata of ACE-Step's prompt template
            (``None``: "N/A", the model chooses).
        shift: schedule shift (1, 2 or 3; 3 is the pipeline default).
        guidance_mode: ``"apg"`` (ACE-Step's, stateless) or ``"cfg"`` (plain CFG).
        apg_norm_threshold: APG's clip on the guidance update's norm over time (2.5).
        cfg_interval: ``(start, end)`` in ``1 - sigma`` where guidance applies (``(0, 1)``: always).
        normalize_loudness: decode as the pipeline does (peak-normalized to -1 dBFS).
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...).
        max_text_length, max_lyric_length: token limits of the caption and the lyrics.
        pipeline: an already built ``AceStepPipeline`` (tests, custom components).

    Prompts are padded to the longest of the batch and the DiT attends to the padding (as in the
    pipeline), so an encoding depends on its batch: encode a rollout's prompts in one call.
    """

    modality = "audio"
    pipeline_classes = ("AceStepPipeline",)
    # Self- and cross-attention projections of every DiT block.
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ("text_encoder", "condition_encoder")
    per_prompt_encoding = False  # prompts are padded to the batch's longest, padding attended

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        audio_duration: float = 30.0,
        lyrics: str = "",
        vocal_language: str = "en",
        bpm: int | None = None,
        keyscale: str | None = None,
        timesignature: str | None = None,
        shift: float = 3.0,
        guidance_mode: str = "apg",
        apg_norm_threshold: float = 2.5,
        cfg_interval: tuple[float, float] = (0.0, 1.0),
        normalize_loudness: bool = True,
        torch_dtype: str | torch.dtype = "float32",
        max_text_length: int = 256,
        max_lyric_length: int = 2048,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import AceStepPipeline

        one_of("ace_step: guidance_mode", guidance_mode, GUIDANCE_MODES)
        if audio_duration <= 0 or shift <= 0:
            raise ValueError("ace_step: audio_duration and shift must be positive")
        pipeline = load_pipeline(AceStepPipeline, "ace_step", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.sample_rate = pipeline.sample_rate
        self.audio_duration = float(audio_duration)
        self.lyrics = lyrics
        self.metadata = dict(vocal_language=vocal_language, bpm=bpm, keyscale=keyscale,
                             timesignature=timesignature)
        self.shift = float(shift)
        self.guidance_mode = guidance_mode
        self.apg_norm_threshold = apg_norm_threshold
        self.cfg_interval = tuple(cfg_interval)
        self.normalize_loudness = normalize_loudness
        self.max_text_length = max_text_length
        self.max_lyric_length = max_lyric_length

    @property
    def supports_cfg(self) -> bool:
        """True for base/SFT checkpoints (learned null condition); turbo ones are distilled."""
        null = getattr(self.pipeline.condition_encoder, "null_condition_emb", None)
        return not self.pipeline.is_turbo and null is not None

    def latent_shape(self) -> tuple[int, int]:
        """``(T, D)`` of one latent: frames at ``latents_per_second`` and acoustic channels."""
        frames = math.ceil(self.audio_duration * self.pipeline.latents_per_second)
        return frames, self.pipeline.transformer.config.audio_acoustic_hidden_dim

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Cond:
        """Packed lyric/timbre/caption states ``[B, S, hidden]``, the DiT's ``context_latents``
        ``[B, T, 2D]`` (silence source latents and an all-ones "generate" mask), and, when the
        checkpoint can guide, the null condition ``neg_encoder_hidden_states [B, 1, hidden]``."""
        pipe, n, device = self.pipeline, len(prompts), self.device
        meta = self.metadata
        text, text_mask, lyric, lyric_mask = pipe.encode_prompt(
            prompt=list(prompts), lyrics=[self.lyrics] * n, device=device,
            vocal_language=meta["vocal_language"], audio_duration=self.audio_duration,
            bpm=meta["bpm"], keyscale=meta["keyscale"], timesignature=meta["timesignature"],
            max_text_length=self.max_text_length, max_lyric_length=self.max_lyric_length,
        )
        encoder = pipe.condition_encoder
        silence = encoder.silence_latent.to(device=device, dtype=self.dtype)
        # No reference audio: the timbre encoder reads 30 s of the learned silence latent.
        timbre = silence[:, : math.ceil(30 * pipe.latents_per_second)].expand(n, -1, -1)
        states, _ = encoder(
            text_hidden_states=text, text_attention_mask=text_mask,
            lyric_hidden_states=lyric, lyric_attention_mask=lyric_mask,
            refer_audio_acoustic_hidden_states_packed=timbre.contiguous(),
            refer_audio_order_mask=torch.arange(n, device=device),
        )
        frames, dim = self.latent_shape()
        repeats = -(-frames // silence.shape[1])
        source = silence.repeat(1, repeats, 1)[:, :frames].expand(n, -1, -1)
        context = torch.cat([source, torch.ones_like(source)], dim=-1)
        tensors = {"encoder_hidden_states": states.to(self.dtype), "context_latents": context}
        if self.supports_cfg:
            null = encoder.null_condition_emb.to(device=device, dtype=self.dtype)
            tensors["neg_encoder_hidden_states"] = null.expand(n, 1, -1).clone()
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, T, D]`` float32, the draw ``AceStepPipeline.prepare_latents`` makes."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (n, *self.latent_shape())
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def schedule(self, num_steps: int) -> torch.Tensor:
        s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)
        if self.shift != 1.0:
            s = self.shift * s / (1 + (self.shift - 1) * s)
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(sigmas=s[:-1].tolist(), device="cpu")
        return scheduler.sigmas.to(torch.float32).clone()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, T, D]``; with ``guidance > 1``, APG or CFG against the null condition."""
        t = cond.tensors
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        timestep = (sigma * self.pipeline.scheduler.config.num_train_timesteps).to(self.dtype)
        states, context = t["encoder_hidden_states"], t["context_latents"]
        guide = guidance > 1.0
        if guide and not self.supports_cfg:
            raise ValueError("ace_step: this checkpoint is guidance-distilled; use guidance=1")
        if guide:  # one batched call: conditional branch first, as the pipeline stacks them
            x = torch.cat([x, x])
            timestep = torch.cat([timestep, timestep])
            states = torch.cat([states, t["neg_encoder_hidden_states"].expand_as(states)])
            context = torch.cat([context, context])
        out = self.transformer(
            hidden_states=x.to(self.dtype),
            timestep=timestep,
            timestep_r=timestep,
            encoder_hidden_states=states,
            context_latents=context,
            return_dict=False,
        )[0]
        if not guide:
            return out
        pos, neg = out.chunk(2)
        guided = self.guide(pos, neg, guidance)
        start, end = self.cfg_interval
        inside = ((1.0 - sigma) >= start) & ((1.0 - sigma) <= end)
        return torch.where(inside.view(b, 1, 1), guided, pos)

    def guide(self, pos: torch.Tensor, neg: torch.Tensor, scale: float) -> torch.Tensor:
        """Combine conditional ``pos`` and null ``neg`` predictions ``[B, T, D]``."""
        if self.guidance_mode == "cfg":
            return neg + scale * (pos - neg)
        from diffusers.guiders.adaptive_projected_guidance import normalized_guidance

        # ACE-Step's APG: pos + (scale - 1) * update, the update clipped (norm over time) and
        # stripped of its component parallel to pos.
        return normalized_guidance(
            pred_cond=pos, pred_uncond=neg, guidance_scale=scale - 1.0, momentum_buffer=None,
            eta=0.0, norm_threshold=self.apg_norm_threshold, use_original_formulation=True,
            norm_dim=(1,),
        )

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, T, D]`` -> waveform ``[B, channels, samples]`` in [-1, 1]."""
        vae = self.pipeline.vae
        audio = vae.decode(x.to(vae.dtype).transpose(1, 2)).sample.float()
        if not self.normalize_loudness:
            return audio.clamp(-1, 1)
        # As the pipeline: divide clipping outputs by their peak, then set the peak to -1 dBFS.
        peak = audio.abs().amax(dim=(1, 2), keepdim=True)
        audio = audio / peak.clamp(min=1.0)
        peak = audio.abs().amax(dim=(1, 2), keepdim=True).clamp(min=1e-6)
        return audio * (10.0 ** (-1.0 / 20.0) / peak)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Scores over time ``[B, n]`` (or ``[B, f, n]``, e.g. a spectrogram map) -> ``[B, T, 1]``.

        A latent frame covers ``1 / latents_per_second`` seconds (40 ms) of every channel, so a
        ``[B, f, n]`` map is first averaged over its ``f`` (frequency) rows; scores on any time
        grid are then area-averaged onto the ``T`` frames and broadcast over the ``D`` channels.
        """
        scores = regions.float()
        if scores.dim() == 3:
            scores = scores.mean(1)
        return F.interpolate(scores[:, None], size=latents.shape[1], mode="area").transpose(1, 2)

