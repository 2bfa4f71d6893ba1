"""LongCat-AudioDiT text-to-speech through diffusers' ``LongCatAudioDiTPipeline``.

Latents are ``[B, T, D]``, time-major: ``T = audio_duration * sample_rate // 2048`` frames (24 kHz
waveform VAE, 2048x downsampling) of ``D = 64`` channels.

Model units: the DiT's time is ``t = 1 - sigma`` (the scheduler is
``FlowMatchEulerDiscreteScheduler(shift=1, invert_sigmas=True)``) and it predicts ``x0 - eps``,
so our velocity is ``v = -model_output``. The schedule is the pipeline's, unshifted:
``sigma_k = 1 - k / N`` (``linspace(1, 1/N, N)`` then 0).

Guidance: the pipeline's CFG, ``null + g (cond - null)``, against the zero text embedding with the
same text mask (the pipeline's default without a negative prompt), as one batched call. The
reference implementation writes its guidance as ``cond + s (cond - null)``: its
``cfg_strength: 4`` is our ``guidance: 5``. Its stateful APG (momentum across steps) is not offered:
a velocity that depends on earlier steps cannot be replayed step by step.

Prompts are padded to the longest of the batch and a ConvNeXt runs over the padded text, so an
encoding depends on its batch (``per_prompt_encoding = False``).

Durations: ``audio_duration`` seconds for every sample, or ``"per_prompt"``: each prompt its own
length, its metadata's ``duration`` (seconds) or else the pipeline's own estimate from the
normalised text (``_approx_duration_from_text``: 0.082 s per English character, 0.21 s per
Chinese one), in frames as the pipeline counts them (``int(seconds * rate // 2048)``, at least
1, at most 30 s). A batch is padded to its longest sample (:mod:`pipelines.lengths`): the
transformer takes a frame mask (``attention_mask``: self-attention keys, the embeddings and the
output are masked), so a sample's velocity is the one a batch of its length alone gives, 0 on
the padding; the condition carries the lengths and :data:`~pipelines.base.LOGPROB_WEIGHT` 0 on
the padding, and :meth:`LongCatTTSAdapter.decode` decodes each sample at its own length.

Voice prompts (voice cloning): the diffusers pipeline does not expose them, but its transformer
takes the reference implementation's conditioning input ``latent_cond``. With ``voice_prompt`` (a
WAV file or waveform) and its transcript ``voice_prompt_text``, this adapter does what the
reference's ``AudioDiTModel`` does: the prompt's VAE latents ``z`` fill the first ``P`` frames
of ``latent_cond``, the text is ``"<prompt text> <text>"``, the prompt frames of the latent stay on
the straight path ``sigma * eps + (1 - sigma) z`` (our velocity there is ``(x - z) / sigma``,
which keeps an Euler rollout on it exactly, as the reference's overwrite does), the null branch
of CFG sees those frames zeroed and an empty ``latent_cond``, and :meth:`decode` drops them. Their
velocity does not depend on the weights, and the condition carries
:data:`~pipelines.base.LOGPROB_WEIGHT` 0 on them, so they add nothing to log-probs and KLs.

LoRA: the pipeline has no LoRA loader and the transformer no diffusers peft mixin; a trained LoRA
is written as a peft state dict with its config (:func:`~pipelines.base.save_peft_lora`) and
loaded back with peft's ``inject_adapter_in_model`` + ``set_peft_model_state_dict``
(:meth:`LongCatTTSAdapter.load_lora`), after which the unchanged diffusers pipeline uses it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .base import (
    LATENT_LENGTH,
    LOGPROB_WEIGHT,
    Cond,
    FlowAdapter,
    PeftLoraFiles,
    load_pipeline,
    register,
)
from .lengths import (
    DURATION_KEY,
    check_audio_duration,
    decode_by_length,
    length_condition,
    metadata_seconds,
    pad_frames,
    padded_length,
)

PROMPT_PAD_FRAMES = 3
"""Latent frames of silence appended to a voice prompt before encoding and then dropped (the
reference implementation's padding, so the prompt's last frames are not cut by the VAE's
receptive field)."""


def normalize_text(text: str) -> str:
    """The pipeline's text normalisation: lower case, quotes to spaces, whitespace collapsed."""
    text = re.sub(r'["“”‘’]', " ", text.lower())
    return re.sub(r"\s+", " ", text).strip()


@register("longcat_tts")
class LongCatTTSAdapter(PeftLoraFiles, FlowAdapter):
    """Adapter for any diffusers ``LongCatAudioDiTPipeline`` folder or hub id.

    Args:
        path_or_id: hub id (``ruixiangma/LongCat-AudioDiT-1B-Diffusers``) or local folder.
        audio_duration: seconds of generated speech per sample (one length for every sample),
            or ``"per_prompt"``: each prompt's metadata ``duration`` (seconds), else the
            pipeline's estimate from its text (0.082 s per English character).
        voice_prompt: a WAV file (or a ``[samples]`` / ``[1, samples]`` waveform at the VAE's
            sample rate) whose voice the speech takes; ``None``: no voice prompt.
        voice_prompt_text: the transcript of ``voice_prompt`` (required with it).
        negative_prompt: only ``""``: guidance is against the zero text embedding.
        torch_dtype: weights dtype (``"float32"``, ``"bfloat16"``, ...).
        pipeline: an already built ``LongCatAudioDiTPipeline`` (tests, custom components).
    """

    modality = "audio"
    pipeline_classes = ("LongCatAudioDiTPipeline",)
    # Self- and cross-attention projections of every DiT block.
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ("text_encoder",)
    per_prompt_encoding = False  # a ConvNeXt runs over the batch-padded text

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        audio_duration: float | str = 5.0,
        voice_prompt: str | torch.Tensor | None = None,
        voice_prompt_text: str = "",
        negative_prompt: str = "",
        torch_dtype: str | torch.dtype = "float32",
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import LongCatAudioDiTPipeline

        seconds = check_audio_duration("longcat_tts", audio_duration)
        if negative_prompt:
            raise ValueError("longcat_tts: guidance is against the zero text embedding (the "
                             "pipeline's default); model.negative_prompt is not supported")
        if voice_prompt is not None and not voice_prompt_text.strip():
            raise ValueError("longcat_tts: voice_prompt needs its transcript in "
                             "voice_prompt_text")
        pipeline = load_pipeline(LongCatAudioDiTPipeline, "longcat_tts", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.sample_rate = int(pipeline.sample_rate)
        self.hop = int(pipeline.vae_scale_factor)
        self.latent_dim = int(pipeline.latent_dim)
        self.audio_duration = seconds  # None: per prompt
        if seconds is None:  # a sample's length is part of its condition
            self.condition_keys = (DURATION_KEY,)
        self.voice_prompt_text = normalize_text(voice_prompt_text)
        self.prompt_latent = (None if voice_prompt is None
                              else self.encode_voice_prompt(voice_prompt))

    # ----------------------------------------------------------------------------------------
    # sizes and the voice prompt

    @property
    def prompt_frames(self) -> int:
        """``P``, the voice prompt's latent frames (0 without one)."""
        return 0 if self.prompt_latent is None else int(self.prompt_latent.shape[1])

    @property
    def per_prompt(self) -> bool:
        """Whether each prompt has its own length (``audio_duration: per_prompt``)."""
        return self.audio_duration is None

    def seconds(self, prompt: str | None = None, meta: dict | None = None) -> float:
        """Seconds of speech generated for ``prompt``: ``audio_duration``; per prompt, its
        metadata's ``duration``, else the pipeline's estimate from the normalised text."""
        if not self.per_prompt:
            return self.audio_duration
        given = metadata_seconds("longcat_tts", meta)
        if given is not None:
            return given
        if prompt is None:
            raise ValueError("longcat_tts: with audio_duration: per_prompt a sample's length "
                             "comes from its prompt; encode it first (initial_noise)")
        from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import (
            _approx_duration_from_text,
        )

        return _approx_duration_from_text(normalize_text(prompt),
                                          float(self.pipeline.max_wav_duration))

    def num_frames(self, prompt: str | None = None, meta: dict | None = None) -> int:
        """``T``: the voice prompt's frames plus the generated ones (``int(seconds * rate //
        2048)``, at least 1, as the pipeline counts), at most the model's 30 s."""
        generated = int(self.seconds(prompt, meta) * self.sample_rate // self.hop)
        limit = int(self.pipeline.max_wav_duration * self.sample_rate // self.hop)
        if self.prompt_frames + 1 > limit:
            raise ValueError(f"longcat_tts: the voice prompt fills the model's "
                             f"{self.pipeline.max_wav_duration:g} s; use a shorter one")
        return min(max(1, generated) + self.prompt_frames, limit)

    @torch.no_grad()
    def encode_voice_prompt(self, audio: str | Path | torch.Tensor) -> torch.Tensor:
        """``[1, P, D]`` float32 latents of a voice prompt: a WAV file (mixed to mono, resampled
        to the VAE's rate) or a waveform at that rate; padded to whole frames plus
        :data:`PROMPT_PAD_FRAMES` frames of silence, encoded with the posterior mean, the padding
        frames dropped."""
        if isinstance(audio, (str, Path)):
            from flowgrpo.audio import load_wav, resample

            wav, rate = load_wav(audio)
            wav = resample(wav.mean(0), rate, self.sample_rate)
        else:
            wav = torch.as_tensor(audio, dtype=torch.float32).reshape(-1)
        if wav.numel() == 0:
            raise ValueError("longcat_tts: the voice prompt is empty")
        vae = self.pipeline.vae
        wav = wav.reshape(1, 1, -1).to(next(vae.parameters()).device)
        wav = F.pad(wav, (0, (-wav.shape[-1]) % self.hop + PROMPT_PAD_FRAMES * self.hop))
        latents = vae.encode(wav.to(vae.dtype), sample_posterior=False).latents.float()
        return latents[..., :-PROMPT_PAD_FRAMES].transpose(1, 2).contiguous()

    # ----------------------------------------------------------------------------------------
    # the adapter interface

    def encode(self, prompts: list[str]) -> Cond:
        """:meth:`encode_inputs` without metadata (per prompt: the lengths from the text)."""
        return self.encode_inputs(prompts)

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """UMT5 states ``[B, S, dim]`` and their mask ``[B, S]`` (the pipeline's encoding of the
        normalised text, with the voice prompt's transcript first); with a voice prompt, the
        per-frame :data:`LOGPROB_WEIGHT` ``[B, T, 1]`` (0 on the prompt's frames). Per prompt,
        also each sample's frames :data:`LATENT_LENGTH` ``[B]`` (from its metadata's
        ``duration`` or its text), ``T`` the longest, and the weight 0 on the padding too."""
        texts = [normalize_text(p) for p in prompts]
        if self.prompt_latent is not None:
            texts = [f"{self.voice_prompt_text} {t}" for t in texts]
        states, lengths = self.pipeline.encode_prompt(texts, self.device)
        mask = torch.arange(states.shape[1], device=self.device)[None] < lengths[:, None]
        tensors = {"encoder_hidden_states": states.to(self.dtype), "encoder_attention_mask": mask}
        if self.per_prompt:
            metadata = metadata if metadata is not None else [{} for _ in prompts]
            frames = [self.num_frames(p, m) for p, m in zip(prompts, metadata)]
            tensors.update(length_condition(frames, self.prompt_frames, self.device))
        elif self.prompt_latent is not None:
            weight = torch.ones(len(prompts), self.num_frames(), 1, device=self.device)
            weight[:, : self.prompt_frames] = 0.0
            tensors[LOGPROB_WEIGHT] = weight
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None,
              frames: int | None = None) -> torch.Tensor:
        """``[n, T, D]`` float32 (``T = frames``, default :meth:`num_frames`), the draw
        ``LongCatAudioDiTPipeline.prepare_latents`` makes."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (n, frames or self.num_frames(), self.latent_dim)
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def initial_noise(self, generators: list[torch.Generator], cond: Cond) -> torch.Tensor:
        """Per prompt: each sample's :meth:`noise` at its own length, zero-padded to the
        batch's longest; otherwise the default."""
        lengths = cond.tensors.get(LATENT_LENGTH)
        if lengths is None:
            return super().initial_noise(generators, cond)
        parts = [self.noise(1, g, int(n)) for g, n in zip(generators, lengths.tolist())]
        return pad_frames(parts, padded_length(cond))

    def schedule(self, num_steps: int) -> torch.Tensor:
        """``linspace(1, 1/N, N)`` then 0: the pipeline's grid, no shift."""
        s = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float32)
        return torch.cat([s, s.new_zeros(1)])

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Velocity ``[B, T, D]``; with ``guidance > 1``, CFG against the zero text embedding."""
        t = cond.tensors
        b, frames = x.shape[0], x.shape[1]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        timestep = (1.0 - sigma).to(self.dtype)
        states, text_mask = t["encoder_hidden_states"], t["encoder_attention_mask"]
        lengths = t.get(LATENT_LENGTH)  # per prompt: the transformer masks each one's padding
        if lengths is None:
            frame_mask = torch.ones(b, frames, dtype=torch.bool, device=x.device)
        else:
            frame_mask = torch.arange(frames, device=x.device)[None] < lengths[:, None]
        latent_cond = x.new_zeros(b, frames, self.latent_dim, dtype=self.dtype)
        p = self.prompt_frames
        if p:
            z = self.prompt_latent.to(x.device)
            latent_cond[:, :p] = z.to(self.dtype)
        hidden = x.to(self.dtype)
        if guidance > 1.0:  # one batched call: [null; cond], the null branch without the prompt
            null_hidden = hidden.clone()
            null_hidden[:, :p] = 0
            out = self._model(
                hidden_states=torch.cat([null_hidden, hidden]),
                encoder_hidden_states=torch.cat([torch.zeros_like(states), states]),
                encoder_attention_mask=torch.cat([text_mask, text_mask]),
                timestep=torch.cat([timestep, timestep]),
                attention_mask=torch.cat([frame_mask, frame_mask]),
                latent_cond=torch.cat([torch.zeros_like(latent_cond), latent_cond]),
            )
            null, pred = out.chunk(2)
            pred = null + guidance * (pred - null)
        else:
            pred = self._model(hidden_states=hidden, encoder_hidden_states=states,
                               encoder_attention_mask=text_mask, timestep=timestep,
                               attention_mask=frame_mask, latent_cond=latent_cond)
        v = -pred
        if p:  # the prompt frames follow the straight path to z, whatever the weights
            path = (x[:, :p].float() - z) / sigma.view(b, 1, 1).clamp_min(1e-6)
            v = torch.cat([path.to(v.dtype), v[:, p:]], dim=1)
        return v

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, T, D]`` -> waveform ``[B, 1, samples]`` in [-1, 1] (voice prompt frames
        dropped). Per prompt, each sample is decoded at its own length (its frames before the
        zero padding) and its waveform padded with silence to the batch's longest."""
        vae = self.pipeline.vae

        def vocode(z: torch.Tensor) -> torch.Tensor:
            return vae.decode(z.to(vae.dtype).transpose(1, 2)).sample.float().clamp(-1, 1)

        generated = x[:, self.prompt_frames:]
        return decode_by_length(generated, vocode) if self.per_prompt else vocode(generated)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Scores over the generated audio's time ``[B, n]`` (or ``[B, f, n]``, e.g. a
        spectrogram map, averaged over ``f``) -> ``[B, T, 1]``: area-averaged onto the generated
        frames (a frame covers ``2048 / 24000`` s of every channel); voice prompt frames get 0."""
        scores = regions.float()
        if scores.dim() == 3:
            scores = scores.mean(1)
        p = self.prompt_frames
        mapped = F.interpolate(scores[:, None], size=latents.shape[1] - p, mode="area")
        return F.pad(mapped, (p, 0)).transpose(1, 2)
