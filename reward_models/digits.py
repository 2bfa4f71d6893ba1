"""The shipped digit classifier and the rewards built on it: ``digit`` (images, and videos frame
by frame) and ``digit_motion`` (the video toy's: the digit of every frame and its motion).

The classifier is a small CNN trained on scikit-learn's bundled 8x8 digits
(``scripts/make_digit_classifier.py``; weights in ``reward_models/assets``, safetensors only).
Every image, whatever its size, reaches it through :func:`to_digit_grid`: grayscale by channel
mean, then area-averaged to 8x8. The classifier was trained on images that went through the same
path (upsampled, shifted, blurred, noised, then averaged back down), so it scores generated images
of any resolution, not only pixel-perfect dataset digits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .base import Reward, RewardOutput, register
from .media import Media, as_frames, average_frames, check_batch, require

if TYPE_CHECKING:
    import numpy as np

ASSETS = Path(__file__).parent / "assets"
CLASSIFIER_PATH = ASSETS / "digit_classifier.safetensors"
GRID = 8  # the classifier's input side, in pixels (scikit-learn's digits are 8x8)
_PROMPT_DIGIT = re.compile(r"(?<![0-9])([0-9])(?![0-9])")
DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
"""Motion directions of the moving-digits video toy as ``(dy, dx)`` in image coordinates."""
_PROMPT_DIRECTION = re.compile(r"\bmoving (" + "|".join(DIRECTIONS) + r")\b")


class DigitClassifier(nn.Module):
    """A small CNN: ``[N, 1, 8, 8]`` grayscale in [0, 1] -> ``[N, 10]`` logits.

    Args:
        width: channels of the first convolution (the second has twice as many).
        hidden: units of the hidden fully connected layer.
    """

    def __init__(self, width: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.width, self.hidden = width, hidden
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * (GRID // 2) ** 2, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 10]`` of grids ``x`` ``[N, 1, 8, 8]`` in [0, 1] (0 = background)."""
        return self.head(self.features((x - 0.5) / 0.5))


def to_digit_grid(images: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` in [0, 1] (any size) -> ``[N, 1, 8, 8]``: channel mean, area average.

    Area averaging (adaptive average pooling) handles any ``H, W``, including non-multiples of 8.
    """
    gray = images.float().mean(dim=1, keepdim=True)
    return F.adaptive_avg_pool2d(gray, GRID)


def load_digit_split(
    test_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as a fixed, stratified train / held-out split.

    Returns:
        ``(x_train, y_train, x_test, y_test)``: images ``[N, 8, 8]`` float32 in [0, 1]
        (pixel values 0..16 divided by 16), labels ``[N]`` int64.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        data.images, data.target, test_size=test_fraction, random_state=seed, stratify=data.target
    )

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32) / 16.0

    def labels(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.int64)

    return images(x_tr), labels(y_tr), images(x_te), labels(y_te)


def digits_to_images(grids: torch.Tensor, size: int) -> torch.Tensor:
    """Dataset digits ``[N, 8, 8]`` in [0, 1] -> RGB images ``[N, 3, size, size]`` in [0, 1].

    Bilinear upsampling, gray repeated on 3 channels: how the toy generator's training images
    are made, and how tests feed real digits to the reward.
    """
    x = F.interpolate(grids[:, None].float(), size=(size, size), mode="bilinear")
    return x.clamp(0, 1).repeat(1, 3, 1, 1)


def moving_digits(
    grids: torch.Tensor,
    directions: list[str],
    size: int = 16,
    frames: int = 5,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dataset digits ``[N, 8, 8]`` in [0, 1] -> videos ``[N, frames, 3, size, size]`` in [0, 1].

    Each digit, at its native 8x8, crosses a black ``size x size`` frame in a straight line in
    its direction (:data:`DIRECTIONS`), from one edge to the other in equal whole-pixel steps; its
    other coordinate is centred, shifted by ``offsets[i]`` pixels (default 0). How the video toy's
    training clips are made, and how tests feed real motion to ``digit_motion``.
    """
    n, travel = len(grids), size - GRID
    if travel < 0 or frames < 2:
        raise ValueError(f"moving_digits needs size >= {GRID} and frames >= 2, got size {size}, "
                         f"frames {frames}")
    if len(directions) != n:
        raise ValueError(f"got {n} digits but {len(directions)} directions")
    offsets = torch.zeros(n, dtype=torch.int64) if offsets is None else offsets.long()
    video = torch.zeros(n, frames, size, size)
    for i, (grid, name) in enumerate(zip(grids, directions)):
        dy, dx = DIRECTIONS[name]
        across = min(max(travel // 2 + int(offsets[i]), 0), travel)
        for k in range(frames):
            along = round(k * travel / (frames - 1))
            along = along if dy + dx > 0 else travel - along
            y, x = (along, across) if dy else (across, along)
            video[i, k, y:y + GRID, x:x + GRID] = grid.float()
    return video.clamp(0, 1)[:, :, None].repeat(1, 1, 3, 1, 1)


def frame_centroids(frames: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` in [0, 1] -> ``[N, 2]`` intensity-weighted ``(y, x)`` in pixels.

    A blank frame's centroid is the frame's centre.
    """
    gray = frames.float().mean(dim=1)
    h, w = gray.shape[-2:]
    mass = gray.sum(dim=(1, 2))
    ys = torch.arange(h, dtype=torch.float32, device=gray.device)
    xs = torch.arange(w, dtype=torch.float32, device=gray.device)
    y = (gray.sum(dim=2) * ys).sum(dim=1) / mass.clamp_min(1e-6)
    x = (gray.sum(dim=1) * xs).sum(dim=1) / mass.clamp_min(1e-6)
    centre = torch.tensor([(h - 1) / 2, (w - 1) / 2], device=gray.device)
    return torch.where((mass > 1e-6)[:, None], torch.stack([y, x], dim=1), centre)


def digit_crops(frames: torch.Tensor) -> torch.Tensor:
    """The 8x8 window of each frame ``[N, C, H, W]`` centred on its centroid -> ``[N, C, 8, 8]``
    (kept inside the frame), where a digit of native size sits in a larger frame."""
    n, _, h, w = frames.shape
    if h < GRID or w < GRID:
        raise ValueError(f"frames must be at least {GRID}x{GRID}, got {h}x{w}")
    centre = frame_centroids(frames)
    top = (centre[:, 0] - (GRID - 1) / 2).round().long().clamp(0, h - GRID)
    left = (centre[:, 1] - (GRID - 1) / 2).round().long().clamp(0, w - GRID)
    return torch.stack([frames[i, :, t:t + GRID, lo:lo + GRID]
                        for i, (t, lo) in enumerate(zip(top.tolist(), left.tolist()))])


def target_directions(prompts: list[str], metadata: list[dict]) -> list[str]:
    """The direction each sample should move in: ``metadata[i]["direction"]``, else the
    prompt's ``"moving <direction>"``."""
    out = []
    for prompt, meta in zip(prompts, metadata):
        name = meta.get("direction")
        if name is None:
            found = _PROMPT_DIRECTION.findall(prompt)
            if len(found) != 1:
                raise ValueError(
                    f"reward 'digit_motion' cannot tell which way prompt {prompt!r} asks to "
                    'move: set metadata["direction"] or write "moving right" (left, up, down)'
                )
            name = found[0]
        if name not in DIRECTIONS:
            raise ValueError(f"reward 'digit_motion': direction must be one of "
                             f"{', '.join(DIRECTIONS)}, got {name!r}")
        out.append(name)
    return out


def save_digit_classifier(model: DigitClassifier, path: str | Path) -> None:
    """Write ``model`` as safetensors, its constructor arguments as JSON in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    config = json.dumps({"width": model.width, "hidden": model.hidden}, sort_keys=True)
    save_file(tensors, str(path), metadata={"config": config})  # one key: byte-stable header


def load_digit_classifier(path: str | Path | None = None) -> DigitClassifier:
    """Load the classifier from safetensors (default: the shipped asset), in eval mode."""
    from safetensors import safe_open

    path = Path(path) if path is not None else CLASSIFIER_PATH
    if not path.is_file():
        raise FileNotFoundError(
            f"no digit classifier at {path}; run `python scripts/make_digit_classifier.py`"
        )
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    model = DigitClassifier(**json.loads(meta.get("config", "{}")))
    model.load_state_dict(state)
    return model.eval().requires_grad_(False)


def target_digits(prompts: list[str], metadata: list[dict] | None) -> torch.Tensor:
    """The digit each sample should show, ``[B]`` int64.

    Taken from ``metadata[i]["digit"]`` when present, else from the prompt's only standalone
    digit ("a handwritten digit 7" -> 7).
    """
    metadata = metadata or [{} for _ in prompts]
    if len(metadata) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(metadata)} metadata dicts")
    out = []
    for prompt, meta in zip(prompts, metadata):
        if meta.get("digit") is not None:
            digit = int(meta["digit"])
        else:
            found = _PROMPT_DIGIT.findall(prompt)
            if len(found) != 1:
                raise ValueError(
                    f"reward 'digit' cannot tell which digit prompt {prompt!r} asks for: set "
                    'metadata["digit"] or write exactly one digit 0-9 in the prompt '
                    '("a handwritten digit 7")'
                )
            digit = int(found[0])
        if not 0 <= digit <= 9:
            raise ValueError(f"reward 'digit': digit must be 0-9, got {digit}")
        out.append(digit)
    return torch.tensor(out, dtype=torch.int64)


@register("digit")
def digit_reward(path: str | None = None, device: str = "cpu") -> Reward:
    """Probability, under the shipped digit classifier, of the digit the prompt asks for.

    Images of any size are reduced by :func:`to_digit_grid`; video scores are averaged over
    frames. Scores are float32 ``[B]`` in [0, 1]; ``info["accuracy"]`` is the fraction of samples
    whose most likely class is the asked digit.

    Args:
        path: classifier safetensors file (default: the shipped asset).
        device: where the classifier runs.
    """
    model = load_digit_classifier(path).to(device)

    @torch.no_grad()
    def reward(media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        frames, per_sample = as_frames(media)
        target = target_digits(prompts, metadata).to(device).repeat_interleave(per_sample)
        probs = model(to_digit_grid(frames.to(device))).softmax(dim=-1)
        per_frame = probs.gather(1, target[:, None])[:, 0]
        hits = (probs.argmax(dim=1) == target).float()
        scores = average_frames(per_frame, per_sample).float().cpu()
        return RewardOutput(scores=scores, info={"accuracy": hits.mean().item()})

    return reward


@register("digit_motion")
def digit_motion_reward(
    motion_weight: float = 0.5, path: str | None = None, device: str = "cpu"
) -> Reward:
    """Scores a video of a moving digit: the right digit in every frame, moving the right way.

    ``score = (1 - motion_weight) * digit + motion_weight * motion``, in [0, 1]:

    - ``digit``: the classifier's probability of the asked digit on each frame's 8x8 window
      around its centroid (:func:`digit_crops`), averaged over frames;
    - ``motion``: how far the centroid travels from the first frame to the last along the asked
      direction, as a fraction of the whole crossing (frame side minus 8), clipped to [0, 1].

    The digit comes from ``metadata["digit"]`` or the prompt, the direction from
    ``metadata["direction"]`` or the prompt's ``"moving right"`` (``left``, ``up``, ``down``).
    ``info`` holds the batch means of both terms and ``accuracy`` (frames whose most likely
    class is the asked digit).

    Args:
        motion_weight: weight of the motion term, in [0, 1].
        path: classifier safetensors file (default: the shipped asset).
        device: where the classifier runs.
    """
    if not 0.0 <= float(motion_weight) <= 1.0:
        raise ValueError(f"digit_motion: motion_weight must be in [0, 1], got {motion_weight}")
    weight = float(motion_weight)
    model = load_digit_classifier(path).to(device)

    @torch.no_grad()
    def reward(media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "video", reward="digit_motion")
        check_batch(media, prompts, metadata, reward="digit_motion")
        video = media.data.float().clamp(0, 1)
        b, f = video.shape[:2]
        frames = video.reshape(b * f, *video.shape[2:]).to(device)
        target = target_digits(prompts, metadata).to(device).repeat_interleave(f)
        probs = model(to_digit_grid(digit_crops(frames))).softmax(dim=-1)
        digit = probs.gather(1, target[:, None])[:, 0].reshape(b, f).mean(dim=1).cpu()
        hits = (probs.argmax(dim=1) == target).float().mean().item()
        centre = frame_centroids(frames).reshape(b, f, 2).cpu()
        direction = torch.tensor([DIRECTIONS[d] for d in target_directions(prompts, metadata)],
                                 dtype=torch.float32)
        travel = torch.tensor(video.shape[-2:], dtype=torch.float32) - GRID
        along = ((centre[:, -1] - centre[:, 0]) * direction).sum(dim=1)
        motion = (along / (direction.abs() * travel).sum(dim=1).clamp_min(1.0)).clamp(0, 1)
        scores = ((1 - weight) * digit + weight * motion).float()
        return RewardOutput(scores=scores, info={"digit": digit.mean().item(),
                                                 "motion": motion.mean().item(),
                                                 "accuracy": hits})

    return reward


__all__ = [
    "CLASSIFIER_PATH",
    "DIRECTIONS",
    "DigitClassifier",
    "digit_crops",
    "digit_motion_reward",
    "digit_reward",
    "digits_to_images",
    "frame_centroids",
    "load_digit_classifier",
    "load_digit_split",
    "moving_digits",
    "save_digit_classifier",
    "target_digits",
    "target_directions",
    "to_digit_grid",
]
