"""Draw the example first frames of ``configs/prompts/i2v_example.jsonl`` (image-to-video).

Nothing can be downloaded where the project is built, so the example prompt set's first frames
are simple scenes drawn with PIL, made once with this script and committed: 832x480 PNGs (the
480P size of Wan2.1 I2V and Wan2.2 I2V-A14B) in ``configs/prompts/i2v/``. Replace them with
real photographs for a real run; any size works (the adapter resizes each to the output size).

Usage: ``python scripts/make_i2v_frames.py [--out configs/prompts/i2v]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT = 832, 480


def vertical_gradient(top: tuple[int, int, int], bottom: tuple[int, int, int],
                      height: int) -> Image.Image:
    """A ``WIDTH x height`` image fading from ``top`` to ``bottom``."""
    image = Image.new("RGB", (WIDTH, height))
    draw = ImageDraw.Draw(image)
    for y in range(height):
        a = y / max(height - 1, 1)
        draw.line([(0, y), (WIDTH, y)],
                  fill=tuple(round(t + a * (b - t)) for t, b in zip(top, bottom, strict=True)))
    return image


def harbor() -> Image.Image:
    """A sailboat on a calm sea under an evening sky."""
    image = vertical_gradient((250, 170, 110), (255, 225, 170), 300)
    sea = vertical_gradient((40, 90, 140), (20, 50, 90), HEIGHT - 300)
    canvas = Image.new("RGB", (WIDTH, HEIGHT))
    canvas.paste(image, (0, 0))
    canvas.paste(sea, (0, 300))
    draw = ImageDraw.Draw(canvas)
    draw.ellipse([560, 200, 660, 300], fill=(255, 240, 200))  # the setting sun
    draw.rectangle([0, 300, WIDTH, 304], fill=(60, 110, 160))
    draw.polygon([(330, 360), (470, 360), (450, 385), (350, 385)], fill=(120, 70, 40))  # hull
    draw.line([(400, 360), (400, 230)], fill=(70, 50, 30), width=4)  # mast
    draw.polygon([(404, 235), (404, 352), (470, 352)], fill=(245, 245, 235))  # sail
    for x in range(0, WIDTH, 48):  # ripples
        draw.arc([x, 410, x + 40, 425], 200, 340, fill=(120, 160, 200), width=2)
    return canvas


def candle() -> Image.Image:
    """A lit candle on a wooden table in a dark room."""
    canvas = vertical_gradient((25, 20, 30), (45, 35, 40), HEIGHT)
    draw = ImageDraw.Draw(canvas)
    draw.rectangle([0, 340, WIDTH, HEIGHT], fill=(110, 70, 40))  # table
    for y in range(350, HEIGHT, 22):
        draw.line([(0, y), (WIDTH, y + 6)], fill=(95, 60, 35), width=2)
    draw.ellipse([300, 150, 530, 380], fill=(70, 50, 35))  # glow on the wall
    draw.rectangle([395, 230, 437, 350], fill=(235, 225, 200))  # candle
    draw.line([(416, 230), (416, 215)], fill=(30, 30, 30), width=2)  # wick
    draw.ellipse([405, 170, 427, 218], fill=(255, 200, 80))  # flame
    draw.ellipse([411, 190, 421, 214], fill=(255, 250, 220))
    return canvas


def kite() -> Image.Image:
    """A red kite in a blue sky over a green hill."""
    canvas = vertical_gradient((90, 150, 230), (190, 220, 250), HEIGHT)
    draw = ImageDraw.Draw(canvas)
    draw.ellipse([-200, 330, 1030, 800], fill=(80, 160, 70))  # hill
    for cx, cy in ((150, 90), (640, 130)):  # clouds
        for dx, dy, r in ((0, 0, 40), (40, -15, 45), (85, 0, 38)):
            draw.ellipse([cx + dx - r, cy + dy - r, cx + dx + r, cy + dy + r],
                         fill=(250, 250, 252))
    draw.polygon([(500, 120), (560, 190), (500, 290), (440, 190)], fill=(210, 40, 40))  # kite
    draw.line([(440, 190), (560, 190)], fill=(120, 20, 20), width=2)
    draw.line([(500, 120), (500, 290)], fill=(120, 20, 20), width=2)
    draw.line([(500, 290), (300, 420)], fill=(60, 60, 60), width=1)  # string
    for i in range(4):  # tail bows
        x, y = 505 + 12 * i, 305 + 22 * i
        draw.polygon([(x - 8, y - 5), (x + 8, y + 5), (x + 8, y - 5), (x - 8, y + 5)],
                     fill=(250, 200, 40))
    return canvas


FRAMES = {"harbor.png": harbor, "candle.png": candle, "kite.png": kite}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="configs/prompts/i2v")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FRAMES.items():
        draw().save(out / name, optimize=True)
        print(out / name)


if __name__ == "__main__":
    main()
