"""Editing rewards on synthetic edits: separation and time per image.

    python benchmarks/editing_rewards.py [--threads N] [--repeats R] [--batch B]

Each source is a textured scene with a sign; the edit box holds the sign. The "good" edit
re-renders the sign with the target word and leaves the rest alone, the "bad" one writes a wrong
word and also repaints a patch outside the box. Sources are PNG files (decoded once, then
cached). Prints the mean scores of both and the wall time per image after one warm-up call, at
256x256 and 512x512.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import reward_models
import reward_models.editing  # noqa: F401  (registers preserve, region_ocr, edit_regions)
from reward_models import Media
from reward_models.media import to_pil
from reward_models.ocr import render_text

WORDS = ["EXIT", "OPEN", "SALE", "MENU", "HOTEL", "BAKERY", "PARKING", "LIBRARY"]


def scene(word: str, side: int, seed: int) -> torch.Tensor:
    """``[3, side, side]``: noise texture, shapes, and a sign with ``word`` in the middle band."""
    gen = torch.Generator().manual_seed(seed)
    image = 0.5 + 0.15 * torch.randn(3, side // 8, side // 8, generator=gen)
    image = torch.nn.functional.interpolate(image[None], size=(side, side), mode="bicubic")[0]
    image[:, side // 16 : side // 4, side // 16 : side // 3] = torch.rand(3, 1, 1, generator=gen)
    top, height = 3 * side // 8, side // 4
    image[:, top : top + height] = render_text(word, (side, height), side // 8)
    return ((image.clamp(0, 1) * 255).round() / 255).clamp(0, 1)


def cases(side: int, batch: int, folder: Path):
    sources, good, bad, meta = [], [], [], []
    for i in range(batch):
        old, new, wrong = WORDS[i % 8], WORDS[(i + 1) % 8], WORDS[(i + 2) % 8]
        source = scene(old, side, i)
        path = folder / f"src{side}_{i}.png"
        to_pil(source[None])[0].save(path)
        sources.append(path)
        good.append(scene(new, side, i))
        edited = scene(wrong, side, i)
        edited[:, -side // 4 :, -side // 4 :] = 0.5  # damage outside the box
        bad.append(edited)
        meta.append({"image": str(path), "boxes": [[0, 0.375, 1, 0.625]], "text": new,
                     "group": i})
    return torch.stack(good), torch.stack(bad), meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads per session")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes over the batch")
    parser.add_argument("--batch", type=int, default=8, help="images per call")
    args = parser.parse_args()
    ocr = reward_models.get("region_ocr", threads=args.threads)
    rewards = {
        "preserve (ssim)": reward_models.get("preserve"),
        "preserve (psnr)": reward_models.get("preserve", metric="psnr"),
        "preserve (ssim, rgb)": reward_models.get("preserve", channels="rgb"),
        "region_ocr": ocr,
        "edit_regions (region_ocr)": reward_models.get("edit_regions", inner=ocr),
    }
    print(f"torch threads={torch.get_num_threads()}, ocr threads={args.threads}, "
          f"batch={args.batch}")
    with tempfile.TemporaryDirectory() as tmp:
        for side in (256, 512):
            good, bad, meta = cases(side, args.batch, Path(tmp))
            prompts = [f'change the sign to say "{m["text"]}"' for m in meta]
            for name, reward in rewards.items():
                reward(Media("image", good[:2]), prompts[:2], meta[:2])  # warm-up
                start = time.perf_counter()
                for _ in range(args.repeats):
                    high = reward(Media("image", good), prompts, meta).scores
                per_image = (time.perf_counter() - start) / (args.repeats * len(good))
                low = reward(Media("image", bad), prompts, meta).scores
                print(f"{side}x{side} {name:26s} good {high.mean():.3f}  bad {low.mean():.3f}  "
                      f"{1000 * per_image:7.1f} ms/image")


if __name__ == "__main__":
    main()
