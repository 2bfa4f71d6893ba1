"""Audio helpers shared by the model families (voice prompts) and the speech rewards: reading PCM
WAV files and band-limited resampling. Both libraries re-export them (``pipelines.media_io``,
``reward_models.media``), so neither imports the other."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import torch


def load_wav(path: str | Path) -> tuple[torch.Tensor, int]:
    """Read a PCM WAV file (8-, 16- or 32-bit, any channel count) with the ``wave`` module.

    Returns:
        ``(audio [C, T] float32 in [-1, 1], sample_rate)``.

    Raises:
        FileNotFoundError: no such file. ValueError: not a PCM WAV file of 8, 16 or 32 bits (one
        line, naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist or is not a file")
    try:
        with wave.open(str(path), "rb") as src:
            channels, width = src.getnchannels(), src.getsampwidth()
            rate, raw = src.getframerate(), src.readframes(src.getnframes())
    except (wave.Error, EOFError, OSError) as err:
        raise ValueError(f"{str(path)!r} is not a readable PCM WAV file ({err})") from None
    kinds = {1: (np.uint8, 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2.0**31)}
    if width not in kinds:
        raise ValueError(f"{str(path)!r} has {8 * width}-bit samples; 8-, 16- or 32-bit PCM WAV "
                         "is supported")
    dtype, offset, scale = kinds[width]
    data = (np.frombuffer(raw, dtype=dtype).astype(np.float32) - offset) / scale
    data = data[: len(data) // channels * channels]
    audio = torch.from_numpy(data.reshape(-1, channels).T.copy())
    return audio, int(rate)


def resample(audio: torch.Tensor, orig_rate: int, new_rate: int, zeros: int = 16) -> torch.Tensor:
    """Band-limited resampling of ``[..., T]`` audio from ``orig_rate`` to ``new_rate`` (Hz).

    Windowed-sinc interpolation (Smith, "Digital Audio Resampling"): the rates are reduced by
    their gcd to ``orig -> new`` and every output phase gets its own kernel, a sinc with cutoff at
    99% of the lower Nyquist frequency under a Hann window spanning ``zeros`` zero crossings, so
    one strided 1-D convolution does the whole batch.

    Returns:
        ``[..., ceil(T * new_rate / orig_rate)]`` float32.
    """
    if orig_rate == new_rate:
        return audio.float()
    g = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // g, int(new_rate) // g
    cutoff = 0.99 * min(orig, new) / orig  # in cycles per input sample, times 2 (1 = Nyquist)
    half = math.ceil(zeros / cutoff)  # kernel half-width in input samples
    # kernel[p, k]: weight of input sample (n*orig - half + k) for output n*new + p.
    offsets = torch.arange(-half, half + orig, dtype=torch.float64)
    t = offsets[None, :] - torch.arange(new, dtype=torch.float64)[:, None] * orig / new
    x = (t * cutoff).clamp(-zeros, zeros)
    window = torch.cos(x * math.pi / (2 * zeros)) ** 2
    kernel = torch.special.sinc(x) * window * cutoff
    shape, length = audio.shape, audio.shape[-1]
    flat = audio.reshape(-1, 1, length).to(torch.float64)
    flat = torch.nn.functional.pad(flat, (half, half + orig))
    out = torch.nn.functional.conv1d(flat, kernel[:, None, :], stride=orig)  # [N, new, L]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)
    target = math.ceil(length * new / orig)
    return out[:, :target].reshape(*shape[:-1], target).float()
