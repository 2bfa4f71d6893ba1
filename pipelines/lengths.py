"""Batches whose samples differ in length: what the speech families share for per-prompt
durations (docs/adapters.md, "Speech families: per-prompt durations").

A sample of ``n`` frames in a batch padded to ``T`` frames is the sample alone plus ``T - n``
frames of exact zeros: its draws are made at its own length and padded
(:func:`pad_frames`), its :data:`~pipelines.base.LOGPROB_WEIGHT` is 0 on the padding and
``T / n`` on its frames (:func:`length_weight`), so a per-sample mean over the padded latent is
the mean over its own frames, and its length travels in the condition under
:data:`~pipelines.base.LATENT_LENGTH`. Decoding reads the length back from the zeros
(:func:`latent_lengths`): the rollout keeps the padding at exactly 0 (zero noise, zero
velocity: every sampler's step from ``x = 0`` with ``v = 0`` is 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .base import LATENT_LENGTH, LOGPROB_WEIGHT, Cond

DURATION_KEY = "duration"
"""The prompt-metadata field of a sample's seconds of generated speech (a ``.jsonl`` prompt
file's ``"duration"``), read by the speech families with ``audio_duration: per_prompt``."""

PER_PROMPT = "per_prompt"
"""The ``audio_duration`` value that gives every prompt its own length."""


def metadata_seconds(family: str, meta: dict | None) -> float | None:
    """The prompt's :data:`DURATION_KEY` in seconds (``None`` when it has none).

    Raises:
        ValueError: one line, when the value is not a finite number of seconds above 0.
    """
    value = (meta or {}).get(DURATION_KEY)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{family}: a prompt's metadata {DURATION_KEY!r} must be seconds > 0, "
                         f"got {value!r}")
    return float(value)


def check_audio_duration(family: str, value: float | str) -> float | None:
    """``audio_duration`` as seconds, or ``None`` for :data:`PER_PROMPT`.

    Raises:
        ValueError: one line, for anything else than seconds > 0 or ``"per_prompt"``.
    """
    if value == PER_PROMPT:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{family}: audio_duration must be seconds > 0 or {PER_PROMPT!r}, got "
                         f"{value!r}")
    return float(value)


def length_weight(lengths: torch.Tensor, total: int, start: int = 0) -> torch.Tensor:
    """``[B, total, 1]`` log-prob weights of samples of ``lengths [B]`` frames padded to
    ``total``: 0 before ``start`` (a voice prompt's frames) and from each length on, ``total /
    length`` between. Without padding (``length == total``) the weight is exactly 1 there."""
    frames = torch.arange(total, device=lengths.device)[None]
    inside = (frames >= start) & (frames < lengths[:, None])
    scale = total / lengths.to(torch.float32)
    return torch.where(inside, scale[:, None], 0.0)[..., None]


def length_condition(lengths: list[int], start: int, device: torch.device) -> dict:
    """The condition entries of a batch of ``lengths`` (frames, voice prompt included) padded to
    the longest: :data:`LATENT_LENGTH` and :data:`LOGPROB_WEIGHT` (see :func:`length_weight`)."""
    n = torch.tensor(lengths, dtype=torch.long, device=device)
    return {LATENT_LENGTH: n, LOGPROB_WEIGHT: length_weight(n, int(n.max()), start)}


def padded_length(cond: Cond) -> int:
    """``T``, the frames a batch with :data:`LATENT_LENGTH` is padded to."""
    return int(cond.tensors[LOGPROB_WEIGHT].shape[1])


def pad_frames(parts: list[torch.Tensor], total: int) -> torch.Tensor:
    """Concatenate ``[b_i, n_i, ...]`` tensors along the batch, each zero-padded to ``total``
    frames (dim 1)."""
    pad = [(0, 0) * (p.dim() - 2) + (0, total - p.shape[1]) for p in parts]
    return torch.cat([F.pad(p, q) if q[-1] else p for p, q in zip(parts, pad)])


def latent_lengths(x: torch.Tensor) -> torch.Tensor:
    """``[B]`` each sample's frames before its trailing all-zero frames (padding), at least 1."""
    nonzero = x.flatten(2).ne(0).any(2)  # [B, T]
    last = torch.where(nonzero, torch.arange(1, x.shape[1] + 1, device=x.device), 0)
    return last.amax(1).clamp_min(1)


def length_groups(lengths: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``[(n, rows)]`` for each distinct length ``n``, ascending, with the rows of that length."""
    return [(int(n), (lengths == n).nonzero().flatten()) for n in lengths.unique().tolist()]


def decode_by_length(x: torch.Tensor, decode: Callable[[torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor:
    """``decode`` each group of equally long samples of ``x [B, T, D]`` at its own length
    (:func:`latent_lengths`) and pad the waveforms ``[b, C, samples]`` with silence to the
    longest: a sample's audio is the audio of that sample decoded alone."""
    lengths = latent_lengths(x)
    if bool((lengths == x.shape[1]).all()):
        return decode(x)
    parts: list[torch.Tensor | None] = [None] * len(x)
    for n, rows in length_groups(lengths):
        audio = decode(x[rows, :n])
        for i, row in enumerate(rows.tolist()):
            parts[row] = audio[i]
    longest = max(p.shape[-1] for p in parts)
    return torch.stack([F.pad(p, (0, longest - p.shape[-1])) for p in parts])
