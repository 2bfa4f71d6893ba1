"""LTX-2 joint text-to-video-and-audio through diffusers' ``LTX2Pipeline``.

Components: ``LTX2VideoTransformer3DModel`` (a video and an audio stream with cross-modal
attention; one call predicts both velocities), ``AutoencoderKLLTX2Video`` (32x spatial, 8x temporal
compression, 128 channels), ``AutoencoderKLLTX2Audio`` (mel spectrogram latents) with a vocoder,
a Gemma 3 text encoder whose stacked hidden states the ``LTX2TextConnectors`` turn into a video
and an audio text embedding.

Latents: both parts of the trajectory in ONE flat tensor per sample, ``[B, Lv Dv + La Da]``: the
video tokens ``[Lv, Dv]`` (the pipeline's packing, as in ``pipelines/ltx.py``; 121 frames at
512x768 -> ``16 * 16 * 24 = 6144`` tokens of 128), then the audio tokens ``[La, Da]`` (the
pipeline's ``[C, L, M] -> [L, C M]`` packing; ``La = round(F / fps * sr / hop / 4)``, 121 frames at
24 fps -> 126 tokens of ``8 * 16 = 128``), each flattened token-major. Samplers, log-probs, KLs and
storage therefore cover both parts with no family code; :meth:`LTX2Adapter.split` and
:meth:`LTX2Adapter.join` convert. Both parts stay normalised (each VAE's ``latents_mean/std``), as
the pipeline keeps them while denoising.

Model units: ``timestep = 1000 * sigma`` for both streams (the pipeline also passes it as
``sigma``). The schedule is the pipeline's: ``linspace(1, 1/N, N)`` through the scheduler with the
dynamic shift ``mu = calculate_shift(Lv)`` (the video token count), stretched to
``shift_terminal``; the audio uses a copy of the same schedule, as the pipeline does.

Guidance, as the pipeline combines it (in x0 space, ``x0 = x - sigma v``, per modality):
``x0 = x0_pos + (g - 1)(x0_pos - x0_neg) + stg (x0_pos - x0_stg) + (m - 1)(x0_pos - x0_iso)``,
then the std rescale of arXiv:2305.08891 against ``x0_pos``, then back to a velocity. ``g`` is the
rollout's ``guidance`` for video and ``audio_guidance_scale`` for audio; CFG is one batched call on
``[negative; positive]``. Spatio-temporal guidance (``stg``: the positive call with self-attention
skipped in ``stg_blocks``) and modality guidance (``m``: the positive call with the cross-modal
attention off) are one more call each; they are off by default here (the pipeline's defaults turn
both on), because each adds a transformer call to every rollout and training step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import LOGPROB_WEIGHT, Cond, load_pipeline, register
from .ltx import LTXAdapter

MEDIA = ("video", "audio")


def _one_line(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"ltx2: {message}")


@register("ltx2")
class LTX2Adapter(LTXAdapter):
    """Adapter for any diffusers ``LTX2Pipeline`` folder or hub id (``Lightricks/LTX-2``).

    The video helpers of :class:`~pipelines.ltx.LTXAdapter` (the latent grid, un-normalising and
    the timestep-conditioned video decode, the region map of the video tokens, the schedule) apply
    unchanged to the video part; this class adds the audio part, the connectors and the guidance.

    Args:
        path_or_id: hub id or local folder.
        height, width: frame size in pixels, multiples of 32 (512x768: the pipeline's default).
        num_frames: frames per video, ``8k + 1`` (121, the pipeline's default).
        frame_rate: frames per second (24): the rotary embedding's time scale and the audio length.
        torch_dtype: weights dtype (LTX-2 is usually run in ``"bfloat16"``).
        negative_prompt: the negative prompt of CFG (the pipeline's default is ``""``).
        max_sequence_length: Gemma tokens (1024, the pipeline default; a multiple of the
            connectors' learnable registers, 128).
        audio_guidance_scale: the audio's CFG scale (7.0, the pipeline default); ``None``: the
            rollout's ``guidance``, as the video.
        guidance_rescale: the video's std rescale in [0, 1] (0.7, the pipeline default; 0: off).
        audio_guidance_rescale: the audio's (0.7, the pipeline default). The pipeline reads 0 as
            "same as video" (``audio or video``); here 0 turns the audio's off.
        stg_scale, audio_stg_scale: spatio-temporal guidance per modality (0: off; the
            pipeline's default is 1.0 with ``stg_blocks = [28]``); ``None``: ``stg_scale``.
        stg_blocks: the transformer blocks STG perturbs.
        modality_scale, audio_modality_scale: modality-isolation guidance (1: off; the pipeline's
            default is 3.0); ``None``: ``modality_scale``.
        media: what :meth:`decode` returns, and so what a reward scores: ``"video"`` (frames
            ``[B, F, 3, H, W]`` in [0, 1], for image and video rewards) or ``"audio"`` (the
            vocoder's waveform ``[B, C, T]`` at :attr:`sample_rate`, for audio rewards).
            :meth:`decode_video_audio` returns both.
        video_weight, audio_weight: each part's per-element weight in log-probs and KLs (1, 1:
            the plain mean over all elements, where the audio holds ``La Da / (Lv Dv + La Da)``
            of the elements, about 2% at the default size). Other values put a
            :data:`~pipelines.base.LOGPROB_WEIGHT` in the encodings; 0 leaves a part untrained.
        decode_timestep, decode_noise_scale, decode_seed: the video decoder's, as in ``ltx``.
        pipeline: an already built ``LTX2Pipeline`` (tests, custom components).
    """

    modality = "video"
    pipeline_classes = ("LTX2Pipeline",)
    # every attention of both streams: video/audio self- and cross-attention, audio<->video
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ("text_encoder", "connectors")

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        height: int = 512,
        width: int = 768,
        num_frames: int = 121,
        frame_rate: float = 24.0,
        torch_dtype: str | torch.dtype = "float32",
        negative_prompt: str = "",
        max_sequence_length: int = 1024,
        audio_guidance_scale: float | None = 7.0,
        guidance_rescale: float = 0.7,
        audio_guidance_rescale: float = 0.7,
        stg_scale: float = 0.0,
        audio_stg_scale: float | None = None,
        stg_blocks: tuple[int, ...] | list[int] = (28,),
        modality_scale: float = 1.0,
        audio_modality_scale: float | None = None,
        media: str = "video",
        video_weight: float = 1.0,
        audio_weight: float = 1.0,
        decode_timestep: float = 0.0,
        decode_noise_scale: float | None = None,
        decode_seed: int = 0,
        pipeline: Any = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        from diffusers import LTX2Pipeline

        pipeline = load_pipeline(LTX2Pipeline, "ltx2", path_or_id, torch_dtype, pipeline,
                                 **from_pretrained_kwargs)
        self._video_options(
            "ltx2", pipeline, height=height, width=width, num_frames=num_frames,
            frame_rate=frame_rate, negative_prompt=negative_prompt,
            max_sequence_length=max_sequence_length, decode_timestep=decode_timestep,
            decode_noise_scale=decode_noise_scale, decode_seed=decode_seed)
        _one_line(media in MEDIA, f"media must be one of {', '.join(MEDIA)}, got {media!r}")
        audio_guidance = audio_guidance_scale
        _one_line(audio_guidance is None or audio_guidance >= 1.0,
                  f"audio_guidance_scale must be >= 1 (1: off) or None (the rollout's "
                  f"guidance), got {audio_guidance}")
        for name, value in (("guidance_rescale", guidance_rescale),
                            ("audio_guidance_rescale", audio_guidance_rescale)):
            _one_line(0.0 <= value <= 1.0, f"{name} must be in [0, 1] (0: off), got {value}")
        for name, value in (("stg_scale", stg_scale), ("audio_stg_scale", audio_stg_scale)):
            _one_line(value is None or value >= 0.0, f"{name} must be >= 0 (0: off), got {value}")
        for name, value in (("modality_scale", modality_scale),
                            ("audio_modality_scale", audio_modality_scale)):
            _one_line(value is None or value >= 1.0, f"{name} must be >= 1 (1: off), got {value}")
        layers = len(self.transformer.transformer_blocks)
        blocks = [int(b) for b in stg_blocks]
        stg_on = stg_scale > 0 or (audio_stg_scale or 0) > 0
        _one_line(not stg_on or all(0 <= b < layers for b in blocks),
                  f"stg_blocks must index the transformer's {layers} blocks, got {blocks}")
        _one_line(video_weight >= 0 and audio_weight >= 0 and video_weight + audio_weight > 0,
                  f"video_weight and audio_weight must be >= 0, not both 0, got "
                  f"{video_weight} and {audio_weight}")
        self.audio_guidance = None if audio_guidance is None else float(audio_guidance)
        self.guidance_rescale = float(guidance_rescale)
        self.audio_guidance_rescale = float(audio_guidance_rescale)
        self.stg = (float(stg_scale), float(stg_scale if audio_stg_scale is None
                                            else audio_stg_scale))
        self.stg_blocks = blocks
        self.modality_guidance = (float(modality_scale), float(
            modality_scale if audio_modality_scale is None else audio_modality_scale))
        self.modality = media
        self.sample_rate = int(pipeline.vocoder.config.output_sampling_rate)
        self.part_weights = (float(video_weight), float(audio_weight))
        _one_line(self.audio_grid()[1] >= 1, f"{num_frames} frames at {frame_rate} fps are "
                  f"shorter than one audio latent frame")

    # --- the two parts of a latent ------------------------------------------------------------

    def audio_grid(self) -> tuple[int, int, int]:
        """``(C, L, M)`` of the unpacked audio latent: channels, latent frames, latent mel bins
        (``L`` as the pipeline computes it from the video's duration)."""
        vae = self.pipeline.audio_vae
        per_second = (self.pipeline.audio_sampling_rate / self.pipeline.audio_hop_length
                      / float(self.pipeline.audio_vae_temporal_compression_ratio))
        length = round(self.num_frames / self.frame_rate * per_second)
        return (vae.config.latent_channels, length,
                vae.config.mel_bins // self.pipeline.audio_vae_mel_compression_ratio)

    def part_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((Lv, Dv), (La, Da))``: the video and audio token grids."""
        c, length, mels = self.audio_grid()
        return self.latent_shape(), (length, c * mels)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat latents ``[B, Lv Dv + La Da]`` -> video ``[B, Lv, Dv]`` and audio ``[B, La, Da]``
        tokens (views)."""
        video, audio = self.part_shapes()
        n = math.prod(video)
        return x[:, :n].unflatten(1, video), x[:, n:].unflatten(1, audio)

    @staticmethod
    def join(video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`split`."""
        return torch.cat([video.flatten(1), audio.flatten(1)], 1)

    def vae_latents_audio(self, audio: torch.Tensor) -> torch.Tensor:
        """Audio tokens ``[B, La, Da]`` -> the audio VAE's un-normalised ``[B, C, L, M]``,
        un-normalised before unpacking as the pipeline does."""
        vae, pipe = self.pipeline.audio_vae, self.pipeline
        audio = pipe._denormalize_audio_latents(audio, vae.latents_mean, vae.latents_std)
        _, length, mels = self.audio_grid()
        return pipe._unpack_audio_latents(audio, length, num_mel_bins=mels)

    def unpacked(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat latents -> the pipeline's ``output_type="latent"`` pair: un-normalised video
        ``[B, C, F', h, w]`` and audio ``[B, C, L, M]`` latents."""
        video, audio = self.split(x)
        return self.vae_latents(video), self.vae_latents_audio(audio)

    # --- the contract ---------------------------------------------------------------------------

    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pipe = self.pipeline
        embeds, mask = pipe._get_gemma_prompt_embeds(
            prompt=prompts, max_sequence_length=self.max_sequence_length, device=self.device)
        side = getattr(pipe.tokenizer, "padding_side", "left")
        video, audio, mask = pipe.connectors(embeds, mask, padding_side=side)
        return video.to(self.dtype), audio.to(self.dtype), mask

    def encode(self, prompts: list[str]) -> Cond:
        """The connectors' video and audio text embeddings ``[B, T, D]`` with their mask
        ``[B, T]`` (prompts padded to ``max_sequence_length``, so independent of the batch), the
        negatives', and the parts' log-prob weights ``[B, N]`` when they are not both 1."""
        video, audio, mask = self._encode(prompts)
        neg_video, neg_audio, neg_mask = self._encode([self.negative_prompt] * len(prompts))
        tensors = {"prompt_embeds": video, "audio_prompt_embeds": audio, "prompt_mask": mask,
                   "neg_prompt_embeds": neg_video, "neg_audio_prompt_embeds": neg_audio,
                   "neg_prompt_mask": neg_mask}
        if self.part_weights != (1.0, 1.0):
            weight = self.join(*(torch.full((1, *shape), w, device=self.device)
                                 for shape, w in zip(self.part_shapes(), self.part_weights)))
            tensors[LOGPROB_WEIGHT] = weight.expand(len(prompts), -1).contiguous()
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Flat ``[n, Lv Dv + La Da]`` float32: ``prepare_latents``' video draw, then
        ``prepare_audio_latents``' audio draw from the same generator, each packed as the pipeline
        packs it."""
        from diffusers.utils.torch_utils import randn_tensor

        c = self.transformer.config.in_channels // (self.patch_t * self.patch ** 2)
        video = randn_tensor((n, c, *self.latent_grid()), generator=generator,
                             device=self.device, dtype=torch.float32)
        audio = randn_tensor((n, *self.audio_grid()), generator=generator, device=self.device,
                             dtype=torch.float32)
        pipe = self.pipeline
        return self.join(pipe._pack_latents(video, self.patch, self.patch_t),
                         pipe._pack_audio_latents(audio))

    def shift_mu(self) -> float:
        """The dynamic-shift exponent ``mu`` from the video token count, with the pipeline's
        defaults for a scheduler config that lacks them."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        config = self.pipeline.scheduler.config
        return calculate_shift(self.latent_shape()[0], config.get("base_image_seq_len", 1024),
                               config.get("max_image_seq_len", 4096),
                               config.get("base_shift", 0.95), config.get("max_shift", 2.05))

    def _call(self, video: torch.Tensor, audio: torch.Tensor, embeds: torch.Tensor,
              audio_embeds: torch.Tensor, mask: torch.Tensor, timestep: torch.Tensor,
              **flags: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One transformer call on a batch whose rows may repeat ``video`` / ``audio``."""
        rows = embeds.shape[0]
        if rows != video.shape[0]:
            video, audio, timestep = (t.repeat(rows // t.shape[0], *[1] * (t.ndim - 1))
                                      for t in (video, audio, timestep))
        frames, h, w = self.latent_grid()
        length = self.audio_grid()[1]
        rope, device = self.transformer, video.device
        v, a = self.transformer(
            hidden_states=video.to(self.dtype), audio_hidden_states=audio.to(self.dtype),
            encoder_hidden_states=embeds, audio_encoder_hidden_states=audio_embeds,
            timestep=timestep, sigma=timestep, encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask, num_frames=frames, height=h, width=w,
            fps=self.frame_rate, audio_num_frames=length,
            video_coords=rope.rope.prepare_video_coords(rows, frames, h, w, device,
                                                        fps=self.frame_rate),
            audio_coords=rope.audio_rope.prepare_audio_coords(rows, length, device),
            use_cross_timestep=True, return_dict=False, **flags)
        return v.float(), a.float()

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """Both velocities, flat like ``x`` (float32), guided as the module docstring says."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        t = cond.tensors
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        timestep = sigma * self.pipeline.scheduler.config.num_train_timesteps
        s = sigma[:, None, None]
        parts = self.split(x.float())
        scales = (float(guidance), float(guidance if self.audio_guidance is None
                                         else self.audio_guidance))
        pos = (t["prompt_embeds"], t["audio_prompt_embeds"], t["prompt_mask"])
        deltas: list[list[torch.Tensor]] = [[], []]  # per part, added in the pipeline's order
        if max(scales) > 1.0:  # one batched call on [negative; positive], as the pipeline
            neg = (t["neg_prompt_embeds"], t["neg_audio_prompt_embeds"], t["neg_prompt_mask"])
            outs = self._call(*parts, *(torch.cat(p) for p in zip(neg, pos)), timestep)
            x0 = [x_ - o.chunk(2)[1] * s for x_, o in zip(parts, outs)]
            for i, (g, x_, o) in enumerate(zip(scales, parts, outs)):
                deltas[i].append((g - 1) * (x0[i] - (x_ - o.chunk(2)[0] * s)))
        else:
            x0 = [x_ - o * s for x_, o in zip(parts, self._call(*parts, *pos, timestep))]
        perturbed = []  # (per-part weights, the positive call's perturbation)
        if max(self.stg) > 0.0:  # self-attention skipped in the STG blocks
            perturbed.append((self.stg, {"spatio_temporal_guidance_blocks": self.stg_blocks}))
        if max(self.modality_guidance) > 1.0:  # audio<->video attention off
            perturbed.append(([m - 1 for m in self.modality_guidance],
                              {"isolate_modalities": True}))
        for weights, flags in perturbed:
            outs = self._call(*parts, *pos, timestep, **flags)
            for i, (w, x_, o) in enumerate(zip(weights, parts, outs)):
                deltas[i].append(w * (x0[i] - (x_ - o * s)))
        velocities = []
        for x_, x0_, delta, rescale in zip(parts, x0, deltas, (self.guidance_rescale,
                                                               self.audio_guidance_rescale)):
            guided = x0_
            for d in delta:
                guided = guided + d
            if rescale > 0:
                guided = rescale_noise_cfg(guided, x0_, guidance_rescale=rescale)
            velocities.append((x_ - guided) / s)
        return self.join(*velocities)

    @torch.no_grad()
    def decode_video_audio(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat latents -> video ``[B, F, 3, H, W]`` in [0, 1] and audio ``[B, C, T]``."""
        return self._decode_video(x), self._decode_audio(x)

    def _decode_video(self, x: torch.Tensor) -> torch.Tensor:
        return super().decode(self.split(x)[0])

    def _decode_audio(self, x: torch.Tensor) -> torch.Tensor:
        """The pipeline's audio decode: the audio VAE's mel spectrogram, then the vocoder's
        waveform (not clipped, as the pipeline returns it)."""
        vae = self.pipeline.audio_vae
        latents = self.vae_latents_audio(self.split(x)[1].float()).to(vae.dtype)
        mel = vae.decode(latents, return_dict=False)[0]
        return self.pipeline.vocoder(mel).float()

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Flat latents -> the ``media`` option's part: video ``[B, F, 3, H, W]`` in [0, 1]
        (the timestep-conditioned decode of ``ltx``) or audio ``[B, C, T]`` at
        :attr:`sample_rate`. Only that part is decoded: a reward scores one kind of media."""
        return self._decode_video(x) if self.modality == "video" else self._decode_audio(x)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Region scores ``[B, h, w]`` on the frame grid -> ``[B, Lv Dv + La Da]`` weights.

        The video part is ``ltx``'s token map (area-averaged onto the token grid, repeated over
        latent frames) broadcast over each token's channels. The audio has no place in the frame:
        each audio element gets the map's mean over the video, so a region shares the audio in
        proportion to its area (over a partition of the frame the audio's weights sum to 1, as
        every video element's do) and a uniform map weighs audio and video alike."""
        video = super().position_weights(regions, latents)  # [B, Lv, 1]
        (_, dv), audio_shape = self.part_shapes()
        video = video.expand(-1, -1, dv)
        audio = video.mean((1, 2))[:, None, None].expand(-1, *audio_shape)
        return self.join(video, audio)
