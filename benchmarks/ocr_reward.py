"""OCR reward on rendered text: accuracy with the right and the wrong target, and time per image.

    python benchmarks/ocr_reward.py [--threads N] [--repeats R]

Renders each phrase at three font sizes on light backgrounds, at 256x128 and 512x512, and
reports the mean score with the right target (should be near 1), with another phrase as target
(should be low), and the mean wall time per image after one warm-up call.
"""

from __future__ import annotations

import argparse
import time

import torch

import reward_models
from reward_models import Media
from reward_models.ocr import render_text

PHRASES = [
    "Hello World", "FLOW GRPO", "open 24 hours", "Coffee Shop", "Quiet Library", "Sale 50%",
    "No Parking", "Fresh Bread", "EXIT", "Welcome Home", "Mind the Gap", "Room 101",
]
BACKGROUNDS = [(235, 230, 220), (250, 250, 250), (220, 235, 245), (245, 235, 200)]


def batch(size: tuple[int, int], font_sizes: tuple[int, ...]) -> tuple[torch.Tensor, list[str]]:
    images, texts = [], []
    for i, phrase in enumerate(PHRASES):
        for font_size in font_sizes:
            background = BACKGROUNDS[(i + font_size) % len(BACKGROUNDS)]
            images.append(render_text(phrase, size, font_size, background))
            texts.append(phrase)
    return torch.stack(images), texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads per session")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes over the batch")
    args = parser.parse_args()
    reward = reward_models.get("ocr", threads=args.threads)
    print(f"threads={args.threads}")
    for size, font_sizes in (((256, 128), (24, 30, 36)), ((512, 512), (32, 48, 64))):
        images, texts = batch(size, font_sizes)
        meta = [{} for _ in texts]
        right_prompts = [f'a sign that says "{t}"' for t in texts]
        wrong_prompts = right_prompts[len(font_sizes):] + right_prompts[: len(font_sizes)]
        reward(Media("image", images[:2]), right_prompts[:2], meta[:2])  # warm-up
        start = time.perf_counter()
        for _ in range(args.repeats):
            right = reward(Media("image", images), right_prompts, meta).scores
        per_image = (time.perf_counter() - start) / (args.repeats * len(images))
        wrong = reward(Media("image", images), wrong_prompts, meta).scores
        print(
            f"{size[0]}x{size[1]} ({len(images)} images): right target {right.mean():.3f} "
            f"(min {right.min():.3f}), wrong target {wrong.mean():.3f} "
            f"(max {wrong.max():.3f}), {1000 * per_image:.1f} ms/image"
        )


if __name__ == "__main__":
    main()
