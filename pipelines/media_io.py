"""Writing decoded samples to disk (videos as GIF, frame grid PNG, MP4 when a writer exists; WAV)
and reading WAV files (voice prompts, reference clips).

Inputs are the adapters' decode outputs for one sample: video ``[F, 3, H, W]`` in [0, 1], audio
``[C, T]`` in [-1, 1]. Only PIL and the standard library are required.
"""

from __future__ import annotations

import importlib.util
import math
import wave
from pathlib import Path

import numpy as np
import torch


def _to_uint8_frames(frames: torch.Tensor) -> np.ndarray:
    """``[F, 3, H, W]`` in [0, 1] -> ``[F, H, W, 3]`` uint8."""
    if frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected video frames [F, 3, H, W], got {tuple(frames.shape)}")
    array = frames.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)
    return array.permute(0, 2, 3, 1).cpu().numpy()


def frame_grid(frames: torch.Tensor, columns: int | None = None) -> np.ndarray:
    """Frames ``[F, 3, H, W]`` tiled row-major into one ``[rows*H, columns*W, 3]`` uint8 image."""
    array = _to_uint8_frames(frames)
    f, h, w, _ = array.shape
    columns = columns or math.ceil(math.sqrt(f))
    rows = math.ceil(f / columns)
    grid = np.zeros((rows * h, columns * w, 3), dtype=np.uint8)
    for i, frame in enumerate(array):
        r, c = divmod(i, columns)
        grid[r * h:(r + 1) * h, c * w:(c + 1) * w] = frame
    return grid


def save_video(frames: torch.Tensor, path: str | Path, fps: int = 16) -> list[Path]:
    """Save one video ``[F, 3, H, W]`` in [0, 1] as ``<path>.gif`` plus ``<path>_grid.png``.

    Also writes ``<path>.mp4`` when ``imageio`` with its ffmpeg plugin is importable (MP4 logs
    are far smaller than GIFs; nothing else is required). ``path``'s suffix, if any, is replaced.

    Args:
        frames: ``[F, 3, H, W]`` floats in [0, 1].
        path: output path stem (``.../step_100/sample_0``).
        fps: frames per second of the animation (Wan2.1 is 16 fps).

    Returns:
        The files written.
    """
    from PIL import Image

    path = Path(path).with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    array = _to_uint8_frames(frames)
    images = [Image.fromarray(frame) for frame in array]
    gif = path.with_suffix(".gif")
    images[0].save(gif, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    grid = path.parent / f"{path.name}_grid.png"
    Image.fromarray(frame_grid(frames)).save(grid)
    written = [gif, grid]
    if importlib.util.find_spec("imageio") and importlib.util.find_spec("imageio_ffmpeg"):
        import imageio.v2 as imageio

        mp4 = path.with_suffix(".mp4")
        imageio.mimwrite(mp4, list(array), fps=fps)
        written.append(mp4)
    return written


def save_wav(audio: torch.Tensor, sample_rate: int, path: str | Path) -> Path:
    """Save one waveform ``[C, T]`` in [-1, 1] as 16-bit PCM WAV (``wave`` module, interleaved).

    Args:
        audio: ``[C, T]`` (or ``[T]`` for mono) floats; values outside [-1, 1] are clipped.
        sample_rate: samples per second per channel (Hz).
        path: the ``.wav`` file to write.
    """
    if audio.dim() == 1:
        audio = audio[None]
    if audio.dim() != 2:
        raise ValueError(f"expected audio [C, T], got {tuple(audio.shape)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = (audio.detach().float().clamp(-1, 1) * 32767).round().to(torch.int16)
    frames = pcm.t().contiguous().cpu().numpy().astype("<i2").tobytes()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(audio.shape[0])
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(frames)
    return path


def __getattr__(name: str):
    # ``load_wav`` lives in :mod:`flowgrpo.audio` (shared by pipelines and rewards); imported on
    # first use so that importing this library stays as light as before
    if name == "load_wav":
        from flowgrpo.audio import load_wav

        return load_wav
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
