"""Wan image-to-video (Wan2.1 I2V, Wan2.2 I2V-A14B, Wan2.2 TI2V-5B) through diffusers'
``WanImageToVideoPipeline``.

The video is generated from a first frame and a prompt. Everything of text-to-video
(:class:`~pipelines.wan.WanAdapter`) carries over: the UMT5 prompt encoding, the Euler schedule
with the checkpoint's flow shift, ``timestep = 1000 * sigma``, CFG as one batched call, the two
experts of Wan2.2 A14B split at ``boundary_ratio`` (0.9 for I2V-A14B), ``guidance_scale_2`` and
``lora_expert``, decoding, LoRA files. The latents are the generated video's, ``[B, z, F', h,
w]`` (``z`` the VAE's latent channels, 16; 48 for TI2V-5B); the first frame lives in the
:class:`~pipelines.base.Cond`, encoded once per distinct (prompt, image) as the pipeline encodes
it:

- **Wan2.1 I2V and Wan2.2 I2V-A14B** (``in_channels = 2 z + 4``): the first frame, resized to
  ``height x width``, followed by ``F - 1`` black frames, is VAE-encoded (the posterior's mode)
  and normalised with the VAE's ``latents_mean`` / ``latents_std``: ``image_latents [B, z, F', h,
  w]``. Each model call takes ``[x; mask; image_latents]`` on the channels, the mask 1 on the
  first latent frame (its ``vae_scale_temporal`` = 4 channels stand for the 4 frames a latent
  frame covers; the first latent frame covers frame 0 alone, repeated) and 0 elsewhere.
- **Wan2.1 I2V** also has a CLIP image encoder (the transformer's ``image_dim``): the
  penultimate hidden states of ``CLIPVisionModel`` on the first frame as the pipeline's
  ``CLIPImageProcessor`` prepares it (the original image, not the resized one), ``image_embeds
  [B, 257, 1280]``, attended by every block's cross-attention beside the text. Its transformer
  splits the image tokens off its context by assuming exactly 512 text tokens, so
  ``max_sequence_length`` must be 512. Wan2.2 I2V-A14B has no image encoder.
- **Wan2.2 TI2V-5B** (``expand_timesteps``, ``in_channels = z``): only the first frame is
  encoded, ``image_latents [B, z, 1, h, w]``. In every model call the first latent frame is that
  encoding and its tokens get timestep 0, the others ``1000 * sigma``. The pipeline lets its
  latent's first frame drift and overwrites it with the encoding at the end; here the first
  frame of the latents follows the straight path to the encoding instead (velocity
  ``(x - image_latents) / sigma``, the data prediction being the encoding), so an Euler rollout
  ends on it, and the last step, into sigma 0, is Euler under every sampler. Those positions
  carry :data:`~pipelines.base.LOGPROB_WEIGHT` 0: their velocity does not depend on the
  weights, so they add nothing to log-probs and KLs. The checkpoint's ``model_index.json``
  names ``WanPipeline``; ``WanImageToVideoPipeline`` loads it.

First frames come from each sample's metadata ``"image"`` (a path, relative to the ``.jsonl``
prompt set, a PIL image, or a ``[3, h, w]`` / ``[1, 3, h, w]`` tensor in [0, 1]), else from the
``image`` option (one picture animated by every prompt, e.g. with a ``.txt`` prompt set). Every
first frame is resized to the adapter's ``height x width`` with the pipeline's plain resize,
which does not keep the aspect ratio: crop sources to the output's aspect ratio beforehand. A
tensor source goes to the CLIP processor without its 1/255 rescale (it is in [0, 1] already);
the pipeline would rescale it again.

With the Euler sampler and the same latents a rollout reproduces
``WanImageToVideoPipeline.__call__(..., output_type="latent")`` run with that Euler scheduler
(the pipeline takes one image per call; a batch of different first frames matches one call per
sample). Not covered: the first-last-frame variant (the pipeline's ``last_image``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import LOGPROB_WEIGHT, Cond, guided_call, load_pipeline, register
from .flux_kontext import load_source_image
from .wan import WanAdapter

WAN21_TEXT_TOKENS = 512
"""The text tokens Wan2.1 I2V's attention assumes when it splits the image tokens off its
context (diffusers' ``WanAttnProcessor``)."""


@register("wan_i2v")
class WanI2VAdapter(WanAdapter):
    """Adapter for any diffusers ``WanImageToVideoPipeline`` folder or hub id: Wan2.1 I2V 14B
    (480P, 720P), Wan2.2 I2V-A14B (two experts) and Wan2.2 TI2V-5B (a ``WanPipeline`` folder).

    Args:
        path_or_id: hub id (``Wan-AI/Wan2.1-I2V-14B-480P-Diffusers``,
            ``Wan-AI/Wan2.2-I2V-A14B-Diffusers``) or local folder.
        image: the first frame of samples whose metadata has no ``"image"`` (a path, a PIL
            image or a tensor in [0, 1]); ``None``: every sample must bring its own.
        max_sequence_length: UMT5 tokens (512, the pipeline default; Wan2.1 I2V requires 512).
        height, width, num_frames, torch_dtype, negative_prompt, flow_shift, guidance_scale_2,
            lora_expert, pipeline: as :class:`~pipelines.wan.WanAdapter` (hub schedulers:
            ``flow_shift`` 3.0 for Wan2.1 I2V 480P, 5.0 for 720P and Wan2.2 I2V-A14B).
    """

    pipeline_classes = ("WanImageToVideoPipeline", "WanPipeline")
    # the VAE encodes the first frames next to the text and image encoders (offloaded with them)
    text_encoder_names = ("text_encoder", "image_encoder", "vae")
    condition_keys = ("image",)

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        image: Any = None,
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
        from diffusers import WanImageToVideoPipeline

        pipeline = load_pipeline(WanImageToVideoPipeline, "wan_i2v", path_or_id, torch_dtype,
                                 pipeline, **from_pretrained_kwargs)
        if not isinstance(pipeline, WanImageToVideoPipeline):
            raise ValueError(f"wan_i2v: needs a WanImageToVideoPipeline, got "
                             f"{type(pipeline).__name__} (text-to-video is family wan)")
        try:  # WanAdapter's option checks, under this family's name
            super().__init__(height=height, width=width, num_frames=num_frames,
                             torch_dtype=torch_dtype, negative_prompt=negative_prompt,
                             max_sequence_length=max_sequence_length, flow_shift=flow_shift,
                             guidance_scale_2=guidance_scale_2, lora_expert=lora_expert,
                             pipeline=pipeline)
        except ValueError as err:
            message = str(err)
            if message.startswith("wan: "):
                raise ValueError("wan_i2v: " + message[len("wan: "):]) from None
            raise
        z = pipeline.vae.config.z_dim
        want = z if self.expand_timesteps else 2 * z + self.scale_t
        layout = ("the video latents" if self.expand_timesteps else
                  f"the video latents, a {self.scale_t}-channel mask and the first frame's latents")
        for name in ("transformer", "transformer_2"):
            model = getattr(pipeline, name, None)
            if model is not None and model.config.in_channels != want:
                raise ValueError(f"wan_i2v: {name} takes {model.config.in_channels} input "
                                 f"channels, not the {want} of image-to-video ({layout}); a "
                                 f"text-to-video checkpoint is family wan")
        config = pipeline.transformer.config
        # the pipeline's test: only a Wan2.1 I2V transformer takes image embeddings
        self.image_embeds = config.image_dim is not None
        if self.image_embeds and (pipeline.image_encoder is None
                                  or pipeline.image_processor is None):
            raise ValueError("wan_i2v: the transformer takes CLIP image embeddings (image_dim "
                             f"{config.image_dim}) but the pipeline has no image_encoder or "
                             "image_processor")
        if config.added_kv_proj_dim is not None and max_sequence_length != WAN21_TEXT_TOKENS:
            raise ValueError(f"wan_i2v: this transformer splits its context assuming "
                             f"{WAN21_TEXT_TOKENS} text tokens; set max_sequence_length: "
                             f"{WAN21_TEXT_TOKENS}, got {max_sequence_length}")
        if pipeline.image_encoder is not None:
            pipeline.image_encoder.requires_grad_(False).eval()
        self.image = image

    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(z, F', h, w)`` of one latent: the VAE's channels (the transformer takes more)."""
        frames = (self.num_frames - 1) // self.scale_t + 1
        return (self.pipeline.vae.config.z_dim, frames, self.height // self.scale_s,
                self.width // self.scale_s)

    # -- first frames -------------------------------------------------------------------------
    @torch.no_grad()
    def encode_image(self, image: Any) -> dict[str, torch.Tensor]:
        """One first frame (path, PIL image or tensor in [0, 1]) -> ``image_latents [1, z, F',
        h, w]`` (``[1, z, 1, h, w]`` with ``expand_timesteps``; float32, as the pipeline keeps
        its condition) and, for Wan2.1, ``image_embeds [1, T_img, image_dim]`` (model dtype):
        the pipeline's ``prepare_latents`` and ``encode_image`` for that image."""
        pipe = self.pipeline
        image = load_source_image(image, "wan_i2v")
        out = {}
        if self.image_embeds:
            rescale = {"do_rescale": False} if isinstance(image, torch.Tensor) else {}
            encoder = pipe.image_encoder
            pixels = pipe.image_processor(images=image, return_tensors="pt", **rescale)
            states = encoder(**pixels.to(next(encoder.parameters()).device),
                             output_hidden_states=True).hidden_states[-2]
            out["image_embeds"] = states.to(self.device, self.dtype)
        frame = pipe.video_processor.preprocess(image, height=self.height, width=self.width)
        video = frame.to(torch.float32).unsqueeze(2)  # [1, 3, 1, H, W] in [-1, 1]
        if not self.expand_timesteps:  # the first frame, then black frames
            black = video.new_zeros(1, 3, self.num_frames - 1, self.height, self.width)
            video = torch.cat([video, black], dim=2)
        vae = pipe.vae
        latents = vae.encode(video.to(next(vae.parameters()).device, vae.dtype)).latent_dist.mode()
        latents = latents.to(self.device, torch.float32)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents)
        out["image_latents"] = (latents - mean) * inv_std
        return out

    def first_frames(self, metadata: list[dict] | None, n: int) -> list[Any]:
        """Each sample's first frame: its metadata ``"image"``, else the ``image`` option."""
        if metadata is not None and len(metadata) != n:
            raise ValueError(f"wan_i2v: {n} prompts but {len(metadata)} metadata rows")
        rows = metadata if metadata is not None else [{}] * n
        frames = [(m or {}).get("image") for m in rows]
        frames = [self.image if f is None else f for f in frames]
        missing = [i for i, f in enumerate(frames) if f is None]
        if missing:
            raise ValueError(f"wan_i2v: samples {missing} have no first frame; give each prompt "
                             f"an 'image' (a .jsonl prompt set) or set the image option")
        return frames

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """The UMT5 encodings plus each sample's first frame (metadata ``"image"``, else the
        ``image`` option) as ``image_latents`` (and ``image_embeds`` for Wan2.1); with
        ``expand_timesteps``, :data:`LOGPROB_WEIGHT` ``[B, 1, F', 1, 1]``, 0 on the first latent
        frame."""
        cond = super().encode(prompts)
        cache: dict[Any, dict[str, torch.Tensor]] = {}
        parts = []
        for frame in self.first_frames(metadata, len(prompts)):
            key = frame if isinstance(frame, str) else id(frame)  # a shared image: once
            if key not in cache:
                cache[key] = self.encode_image(frame)
            parts.append(cache[key])
        for name in parts[0]:
            cond.tensors[name] = torch.cat([p[name] for p in parts])
        if self.expand_timesteps:
            weight = torch.ones(len(prompts), 1, self.latent_shape()[1], 1, 1, device=self.device)
            weight[:, :, 0] = 0.0
            cond.tensors[LOGPROB_WEIGHT] = weight
        return cond

    def encode(self, prompts: list[str]) -> Cond:
        """:meth:`encode_inputs` without metadata: every sample animates the ``image`` option."""
        return self.encode_inputs(prompts)

    # -- model call ---------------------------------------------------------------------------
    def _expert_velocity(self, is_high: bool, x: torch.Tensor, sigma: torch.Tensor, cond: Cond,
                         guidance: float) -> torch.Tensor:
        """One expert's velocity ``[b, z, F', h, w]`` with the first frame's conditioning: the
        pipeline's model input and timesteps, CFG's branches sharing the image inputs."""
        trained = is_high == (self.lora_expert == "high")
        model = self.transformer if trained else self.frozen_expert
        if not is_high and self.guidance_scale_2 is not None and guidance > 1.0:
            guidance = self.guidance_scale_2
        t = cond.tensors
        image = t["image_latents"].to(x.device)
        timestep = sigma * self.scheduler.config.num_train_timesteps
        if self.expand_timesteps:  # the first latent frame is the image's, at timestep 0
            hidden = torch.cat([image, x[:, :, 1:].float()], dim=2)
            per_frame = math.prod(n // p for n, p in zip(x.shape[3:], self.patch[1:], strict=True))
            timestep = timestep[:, None].repeat(1, x.shape[2] * per_frame)
            timestep[:, :per_frame] = 0.0
        else:  # [x; mask; image latents] on the channels, the mask 1 on the first latent frame
            mask = torch.zeros(x.shape[0], self.scale_t, *x.shape[2:], device=x.device)
            mask[:, :, 0] = 1.0
            hidden = torch.cat([x.float(), mask, image], dim=1)
        v = guided_call(
            lambda **inputs: model(**inputs, return_dict=False)[0], guidance,
            {"hidden_states": hidden.to(self.dtype), "timestep": timestep,
             "encoder_hidden_states": t["prompt_embeds"],
             "encoder_hidden_states_image": t.get("image_embeds")},
            {"encoder_hidden_states": t["neg_prompt_embeds"]},
        )
        if self.expand_timesteps:  # the first frame's straight path to the image's latents
            s = sigma.view(-1, 1, 1, 1, 1).clamp_min(1e-6)
            path = (x[:, :, :1].float() - image) / s
            v = torch.cat([path.to(v.dtype), v[:, :, 1:]], dim=2)
        return v
