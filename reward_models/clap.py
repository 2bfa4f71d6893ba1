"""CLAP text-audio similarity (Wu et al. 2023, LAION-CLAP) with transformers ``ClapModel``.

Audio ``[B, C, T]`` is averaged to mono and resampled to the feature extractor's rate (48 kHz for
the LAION checkpoints) in :mod:`reward_models.media`, then cut to the extractor's window (10 s):
the first window is scored, so the reward stays deterministic (the extractor would otherwise pick
a random crop of longer clips). ``score = scale * cos(audio, prompt)``.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import RewardOutput, register
from .clip import hf_text_features, pick_device, pooled, unique_prompts
from .media import Media, check_batch, require, to_mono


@register("clap")
class CLAPScore:
    """CLAP score reward for audio.

    Args:
        model: ``ClapModel`` hub id, local folder, or built model.
        processor: ``ClapProcessor`` hub id, local folder, or built processor (anything with
            ``.tokenizer`` and ``.feature_extractor``); default ``model``.
        device: default CUDA when available.
        batch_size: clips or texts per forward pass.
        scale: multiplies the cosine.
        dtype: model weights dtype name.

    Returns ``scores[B] = scale * cos(audio embedding, text embedding)``.
    """

    def __init__(
        self,
        model: Any = "laion/clap-htsat-unfused",
        processor: Any = None,
        device: str | None = None,
        batch_size: int = 16,
        scale: float = 1.0,
        dtype: str = "float32",
    ) -> None:
        from transformers import ClapModel, ClapProcessor

        self.device = pick_device(device)
        processor = model if processor is None else processor
        if isinstance(processor, str):
            processor = ClapProcessor.from_pretrained(processor)
        self.tokenizer, self.features = processor.tokenizer, processor.feature_extractor
        if isinstance(model, str):
            model = ClapModel.from_pretrained(model, dtype=getattr(torch, dtype))
        self.model = model.eval().to(self.device)
        self.dtype = next(self.model.parameters()).dtype
        self.batch_size, self.scale = int(batch_size), float(scale)
        self.rate = int(self.features.sampling_rate)
        self.window = int(self.features.nb_max_samples)
        positions = int(self.model.config.text_config.max_position_embeddings) - 2  # RoBERTa offset
        self.max_length = min(int(self.tokenizer.model_max_length), positions)

    @torch.no_grad()
    def encode_audio(self, audio: torch.Tensor) -> torch.Tensor:
        """``[N, T]`` mono at ``self.rate`` -> L2-normalized embeddings ``[N, D]`` float32."""
        out = []
        for chunk in audio[:, : self.window].split(self.batch_size):
            inputs = self.features(
                [a.numpy() for a in chunk.float().cpu()], sampling_rate=self.rate,
                return_tensors="pt",
            )
            feats = self.model.get_audio_features(
                input_features=inputs["input_features"].to(self.device, self.dtype),
                is_longer=inputs.get("is_longer", None),
            )
            out.append(pooled(feats).float().cpu())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """``N`` strings -> L2-normalized embeddings ``[N, D]`` float32."""
        return hf_text_features(self.model, self.tokenizer, texts, self.batch_size,
                                self.max_length, self.device).cpu()

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "audio", reward="clap")
        check_batch(media, prompts, metadata, reward="clap")
        from flowgrpo.audio import resample

        audio = resample(to_mono(media.data), int(media.sample_rate), self.rate)
        texts, index = unique_prompts(prompts)
        cos = (self.encode_audio(audio) * self.encode_texts(texts)[index]).sum(-1)
        return RewardOutput(scores=(self.scale * cos).float(), info={"cos_mean": float(cos.mean())})
