"""The one place that turns model output into what rewards expect.

Pipelines decode to plain tensors (docs/design.md, "Conventions"): image ``[B, 3, H, W]`` in [0, 1],
video ``[B, F, 3, H, W]`` in [0, 1], audio ``[B, C, T]`` in [-1, 1] plus a sample rate. The trainer
wraps them in :class:`Media`; rewards call the converters below instead of guessing layouts.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import torch

KINDS = ("image", "video", "audio")


@dataclass
class Media:
    """A batch of generated media.

    Attributes:
        kind: ``"image"``, ``"video"`` or ``"audio"``.
        data: image ``[B, 3, H, W]`` / video ``[B, F, 3, H, W]`` in [0, 1]; audio ``[B, C, T]``.
        sample_rate: audio samples per second (audio only).
    """

    kind: str
    data: torch.Tensor
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown media kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")
        want = {"image": 4, "video": 5, "audio": 3}[self.kind]
        if self.data.dim() != want:
            raise ValueError(
                f"{self.kind} media must have {want} dims, got shape {tuple(self.data.shape)}"
            )
        if self.kind == "audio" and not self.sample_rate:
            raise ValueError("audio media needs a sample_rate")

    def __len__(self) -> int:
        return self.data.shape[0]

    def index(self, idx: torch.Tensor | list[int] | slice) -> Media:
        """The sub-batch ``idx`` (same kind and sample rate)."""
        return Media(self.kind, self.data[idx], self.sample_rate)


def require(media: Media, *kinds: str, reward: str) -> None:
    """Raise a clear error when ``reward`` cannot score media of this kind."""
    if not isinstance(media, Media):
        raise TypeError(
            f"reward {reward!r} expects a reward_models.Media, got {type(media).__name__}"
        )
    if media.kind not in kinds:
        raise ValueError(
            f"reward {reward!r} scores {' or '.join(kinds)} media, got {media.kind} media"
        )


def check_batch(media: Media, prompts: list[str], metadata: list[dict], reward: str) -> None:
    """Raise a clear error when prompts or metadata do not have one entry per sample."""
    if len(prompts) != len(media) or len(metadata) != len(media):
        raise ValueError(
            f"reward {reward!r} got {len(media)} samples but {len(prompts)} prompts and "
            f"{len(metadata)} metadata dicts; pass one of each per sample"
        )

def as_frames(media: Media) -> tuple[torch.Tensor, int]:
    """Images as ``[N, 3, H, W]`` float32 in [0, 1] and the number of frames per sample.

    Video ``[B, F, 3, H, W]`` is flattened to ``[B*F, 3, H, W]`` (frames per sample ``F``) so that
    an image reward scores every frame; average back with :func:`average_frames`.
    """
    require(media, "image", "video", reward="image reward")
    data = media.data.float().clamp(0, 1)
    if media.kind == "image":
        return data, 1
    b, f = data.shape[:2]
    return data.reshape(b * f, *data.shape[2:]), f


def average_frames(scores: torch.Tensor, frames: int) -> torch.Tensor:
    """Per-frame scores ``[B*F]`` -> per-sample mean ``[B]``."""
    return scores.reshape(-1, frames).mean(dim=1)


def to_uint8_hwc(images: torch.Tensor) -> torch.Tensor:
    """``[N, 3, H, W]`` in [0, 1] -> ``[N, H, W, 3]`` uint8 (PIL / numpy / OCR layout)."""
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu()


# --- image preprocessing for vision-language scorers (torch ops, batched, any device) ---------


def resize_crop(
    images: torch.Tensor,
    size: int | tuple[int, int],
    interpolation: str = "bicubic",
    resize_mode: str = "shortest",
) -> torch.Tensor:
    """Resize ``[N, 3, H, W]`` images to ``size`` the way CLIP-style preprocessors do.

    Args:
        images: ``[N, 3, H, W]`` float in [0, 1].
        size: output side (int, square) or ``(height, width)`` in pixels.
        interpolation: ``"bicubic"``, ``"bilinear"`` or ``"nearest"``; antialiased when shrinking,
            as PIL does, so small tensors and PIL round trips agree to about 1/255.
        resize_mode: ``"shortest"`` scales the shortest side to the target then center-crops
            (CLIP / open_clip default); ``"squash"`` resizes both sides directly; ``"longest"``
            scales the longest side to the target and pads with zeros (letterbox).

    Returns:
        ``[N, 3, h, w]`` float in [0, 1].
    """
    th, tw = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    n, c, h, w = images.shape
    mode = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}.get(interpolation)
    if mode is None:
        raise ValueError(
            f"unknown interpolation {interpolation!r}; use bicubic, bilinear or nearest"
        )
    kw = {} if mode == "nearest" else {"antialias": True, "align_corners": False}

    def _resize(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if tuple(x.shape[-2:]) == hw:
            return x
        return torch.nn.functional.interpolate(x, size=hw, mode=mode, **kw)

    x = images.float()
    if resize_mode == "squash":
        return _resize(x, (th, tw)).clamp(0, 1)
    if resize_mode == "shortest":
        scale = max(th / h, tw / w)
        x = _resize(x, (max(th, round(h * scale)), max(tw, round(w * scale))))
        top, left = (x.shape[-2] - th) // 2, (x.shape[-1] - tw) // 2
        return x[..., top : top + th, left : left + tw].clamp(0, 1)
    if resize_mode == "longest":
        scale = min(th / h, tw / w)
        x = _resize(x, (max(1, round(h * scale)), max(1, round(w * scale))))
        out = x.new_zeros(n, c, th, tw)
        top, left = (th - x.shape[-2]) // 2, (tw - x.shape[-1]) // 2
        out[..., top : top + x.shape[-2], left : left + x.shape[-1]] = x
        return out.clamp(0, 1)
    raise ValueError(f"unknown resize_mode {resize_mode!r}; use shortest, squash or longest")


def normalize(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """Per-channel ``(x - mean) / std`` on ``[N, 3, H, W]``."""
    m = torch.as_tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (images - m) / s


def to_pil(images: torch.Tensor) -> list:
    """``[N, 3, H, W]`` in [0, 1] -> list of RGB ``PIL.Image`` (8 bits per channel)."""
    from PIL import Image

    return [Image.fromarray(a.numpy(), "RGB") for a in to_uint8_hwc(images)]


def from_pil(images: list) -> torch.Tensor:
    """List of same-size ``PIL.Image`` -> ``[N, 3, H, W]`` float32 in [0, 1]."""
    import numpy as np

    arrays = [np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0


# --- audio ---------------------------------------------------------------------------------------


def to_mono(audio: torch.Tensor) -> torch.Tensor:
    """``[B, C, T]`` -> ``[B, T]`` by averaging channels."""
    return audio.float().mean(dim=1)


# --- wire formats: base64 PNG / WAV (no pickle) --------------------------------------------------


def encode_png(image: torch.Tensor) -> str:
    """``[3, H, W]`` in [0, 1] -> base64 PNG (8 bits per channel, lossless after rounding)."""
    import io

    buf = io.BytesIO()
    to_pil(image[None])[0].save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_png(data: str) -> torch.Tensor:
    """base64 PNG (or any format PIL reads) -> ``[3, H, W]`` float32 in [0, 1]."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as im:
        return from_pil([im])[0]


def encode_wav(audio: torch.Tensor, sample_rate: int) -> str:
    """``[C, T]`` float audio -> base64 WAV, 32-bit IEEE float (lossless for float32)."""
    samples = audio.detach().float().cpu().T.contiguous().numpy().astype("<f4")  # interleaved
    channels, data = audio.shape[0], samples.tobytes()
    block = 4 * channels  # bytes per frame
    fmt = struct.pack("<HHIIHH", 3, channels, sample_rate, sample_rate * block, block, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return base64.b64encode(b"RIFF" + struct.pack("<I", len(body)) + body).decode("ascii")


def decode_wav(data: str) -> tuple[torch.Tensor, int]:
    """base64 WAV (16-bit PCM or 32-bit float) -> (``[C, T]`` float32, sample rate in Hz)."""
    import numpy as np

    raw = base64.b64decode(data, validate=True)
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    pos, fmt, payload = 12, None, None
    while pos + 8 <= len(raw):
        cid, size = raw[pos : pos + 4], struct.unpack("<I", raw[pos + 4 : pos + 8])[0]
        chunk = raw[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            if len(chunk) < 16:
                raise ValueError(f"WAV fmt chunk of {len(chunk)} bytes, 16 expected")
            fmt = struct.unpack("<HHIIHH", chunk[:16])
        elif cid == b"data":
            payload = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or payload is None:
        raise ValueError("WAV file lacks a fmt or data chunk")
    code, channels, rate, _, _, bits = fmt
    if channels < 1 or rate < 1:
        raise ValueError(f"WAV header says {channels} channels at {rate} Hz")
    if (code, bits) == (3, 32):
        samples = np.frombuffer(payload, dtype="<f4")
    elif (code, bits) == (1, 16):
        samples = np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0
    else:
        raise ValueError(f"unsupported WAV encoding (format {code}, {bits} bits)")
    samples = samples[: len(samples) // channels * channels].reshape(-1, channels)
    return torch.from_numpy(samples.T.copy()).float(), int(rate)


def media_to_wire(media: Media) -> list:
    """A batch as JSON-ready base64 strings: image -> ``[png]``, video -> ``[[png per frame]]``,
    audio -> ``[wav]`` (float32 WAV at ``media.sample_rate``). Images are rounded to 8 bits."""
    if media.kind == "image":
        return [encode_png(image) for image in media.data]
    if media.kind == "video":
        return [[encode_png(frame) for frame in video] for video in media.data]
    return [encode_wav(clip, int(media.sample_rate)) for clip in media.data]


def media_from_wire(kind: str, items: list, sample_rate: int | None = None) -> Media:
    """Inverse of :func:`media_to_wire`; raises ``ValueError`` on malformed or ragged input."""
    if kind not in KINDS:
        raise ValueError(f"unknown media kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if not isinstance(items, list) or not items:
        raise ValueError("'media' must be a non-empty list")
    if kind == "image":
        tensors = [decode_png(item) for item in items]
    elif kind == "video":
        if not all(isinstance(video, list) and video for video in items):
            raise ValueError("video media must be a list of non-empty lists of frames")
        tensors = []
        for video in items:
            frames = [decode_png(f) for f in video]
            if len({tuple(f.shape) for f in frames}) != 1:
                raise ValueError("all frames of a video must have one shape")
            tensors.append(torch.stack(frames))
    else:
        decoded = [decode_wav(item) for item in items]
        rates = {rate for _, rate in decoded}
        if len(rates) != 1:
            raise ValueError(f"audio clips have different sample rates: {sorted(rates)}")
        sample_rate = rates.pop()
        tensors = [clip for clip, _ in decoded]
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"all {kind} items must have one shape, got {sorted(shapes)}")
    return Media(kind, torch.stack(tensors), sample_rate)


def __getattr__(name: str):
    # ``resample`` lives in :mod:`flowgrpo.audio` (shared by pipelines and rewards); imported on
    # first use so that importing this library stays as light as before
    if name == "resample":
        from flowgrpo.audio import resample

        return resample
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
