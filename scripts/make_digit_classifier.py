"""Train the shipped digit classifier (the ``digit`` reward) on scikit-learn's bundled digits.

    python scripts/make_digit_classifier.py

writes ``reward_models/assets/digit_classifier.safetensors`` and ``digit_classifier.json`` (its
configuration and held-out accuracy). Deterministic on CPU for a fixed seed and thread count;
about ten seconds on one core.

Why augment: the reward scores *generated* images, which are never pixel-perfect dataset digits.
Every training image is upsampled to a generator-like resolution, warped slightly (shift, rotation,
scale), blurred, re-contrasted and noised, then reduced to 8x8 by the reward's own
:func:`reward_models.digits.to_digit_grid`, so the classifier sees what the reward will feed it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reward_models.digits import (  # noqa: E402 (after the path fix-up above)
    ASSETS,
    DigitClassifier,
    digits_to_images,
    load_digit_split,
    save_digit_classifier,
    to_digit_grid,
)

RESOLUTIONS = (8, 16, 24, 32)  # upsampled sizes seen in training (the toy generator draws 16x16)


def _blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Per-sample separable Gaussian blur of ``x`` ``[N, 1, H, W]``, ``sigma`` ``[N]`` pixels."""
    offsets = torch.arange(-2, 3, dtype=torch.float32)
    kernel = torch.exp(-(offsets[None] ** 2) / (2 * sigma[:, None].clamp_min(1e-3) ** 2))
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # [N, 5]
    n = x.shape[0]
    x = x.reshape(1, n, *x.shape[2:])  # one group per sample
    x = F.conv2d(F.pad(x, (2, 2, 0, 0), mode="replicate"), kernel[:, None, None, :], groups=n)
    x = F.conv2d(F.pad(x, (0, 0, 2, 2), mode="replicate"), kernel[:, None, :, None], groups=n)
    return x.reshape(n, 1, *x.shape[2:])


def augment(grids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Dataset digits ``[N, 8, 8]`` -> augmented classifier inputs ``[N, 1, 8, 8]`` in [0, 1].

    One random resolution per batch; per sample: an affine warp (shift up to ~1 dataset pixel,
    rotation up to 12 degrees, scale 0.9-1.1), a blur, contrast / brightness jitter and noise.
    """
    n = grids.shape[0]

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=generator)

    size = RESOLUTIONS[int(torch.randint(len(RESOLUTIONS), (1,), generator=generator))]
    x = digits_to_images(grids, size)[:, :1]
    angle, scale = uniform(-12, 12) * math.pi / 180, uniform(0.9, 1.1)
    shift = torch.stack([uniform(-0.25, 0.25), uniform(-0.25, 0.25)], dim=1)  # 0.25 = 1 pixel
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1
    )
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    x = _blur(x, uniform(0.0, 0.3 * size / 8))
    x = x * uniform(0.7, 1.1)[:, None, None, None] + uniform(-0.05, 0.1)[:, None, None, None]
    x = x + uniform(0.0, 0.12)[:, None, None, None] * torch.randn(x.shape, generator=generator)
    return to_digit_grid(x.clamp(0, 1))


@torch.no_grad()
def accuracy(model: DigitClassifier, grids: torch.Tensor, labels: torch.Tensor, size: int) -> float:
    """Held-out accuracy of ``model`` on ``grids`` shown at ``size`` x ``size`` (8: as stored)."""
    x = to_digit_grid(digits_to_images(grids, size))
    return (model(x).argmax(dim=1) == labels).float().mean().item()


def train_classifier(
    epochs: int = 40,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 3e-3,
    label_smoothing: float = 0.05,
    width: int = 16,
    hidden: int = 64,
) -> DigitClassifier:
    """Train a :class:`DigitClassifier` on the train split with augmentation (deterministic).

    Label smoothing keeps the reward's probabilities off exact 0 / 1, so groups of good samples
    still differ in reward.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    x_train, y_train, _, _ = load_digit_split()
    model = DigitClassifier(width=width, hidden=hidden)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    total = epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x_train), generator=generator)
        for i in range(steps_per_epoch):
            idx = order[i * batch_size : (i + 1) * batch_size]
            clean = torch.rand((), generator=generator) < 0.25  # some batches un-augmented
            grids = x_train[idx]
            x = to_digit_grid(digits_to_images(grids, 16)) if clean else augment(grids, generator)
            loss = F.cross_entropy(model(x), y_train[idx], label_smoothing=label_smoothing)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval().requires_grad_(False)


def main() -> None:
    """Train, evaluate on the held-out split, write the safetensors and the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ASSETS / "digit_classifier.safetensors")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads; the weights differ in the last bits between counts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    start = time.perf_counter()
    model = train_classifier(epochs=args.epochs, seed=args.seed)
    seconds = time.perf_counter() - start
    _, _, x_test, y_test = load_digit_split()
    acc = {f"{s}x{s}": round(accuracy(model, x_test, y_test, s), 4) for s in (8, 16, 32)}
    generator = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        aug = (model(augment(x_test, generator)).argmax(1) == y_test).float().mean().item()
    aug = round(aug, 4)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_digit_classifier(model, args.out)
    report = {
        "architecture": "DigitClassifier",
        "config": {"width": model.width, "hidden": model.hidden},
        "parameters": sum(p.numel() for p in model.parameters()),
        "split": "load_digit_split(test_fraction=0.2, seed=0): stratified, 360 held-out images",
        "heldout_accuracy": acc,
        "heldout_accuracy_augmented": aug,
        "epochs": args.epochs,
        "seed": args.seed,
    }
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"trained in {seconds:.1f} s; wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
