"""The run directory: resolved config, metrics (JSON lines + TensorBoard/W&B), sample media.

Layout::

    RUN/config.yaml          the resolved config
    RUN/metrics.jsonl        one JSON object per training step (epoch): step, reward/mean, ...
    RUN/tb/                  TensorBoard events
    RUN/samples/             eval grids (PNG), videos (GIF), audio (WAV)
    RUN/checkpoints/step_N/  see flowgrpo.run.checkpoint
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def new_run_dir(root: str | Path = "runs") -> Path:
    """A fresh ``runs/<YYYYmmdd-HHMMSS>`` folder (suffixed when the name is taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / stamp
    n = 1
    while path.exists():
        path = Path(root) / f"{stamp}-{n}"
        n += 1
    return path


class Tracker:
    """Writes metrics and media of the main process; a no-op elsewhere.

    ``purge_step`` (a resume): TensorBoard drops the events of that step and later, which an
    interrupted run wrote after its last checkpoint (``metrics.jsonl`` is cut back by
    :func:`flowgrpo.run.resume.truncate_metrics` before the tracker opens it)."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, wandb_project: str | None,
                 config: dict, purge_step: int | None = None) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self._tb = self._wandb = None
        if not enabled:
            return
        (run_dir / "samples").mkdir(parents=True, exist_ok=True)
        self._metrics = open(run_dir / "metrics.jsonl", "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # on a resume, TensorBoard discards the events at and after purge_step
            self._tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)
        if wandb_project:
            import wandb

            self._wandb = wandb.init(project=wandb_project, dir=str(run_dir), config=config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _number(v) for k, v in metrics.items()}
        self._metrics.write(json.dumps({"step": step, **clean}) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if value is not None:
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def save_media(self, step: int, name: str, media: torch.Tensor, kind: str,
                   sample_rate: int | None = None, nrow: int = 8,
                   prompts: list[str] | None = None,
                   scores: Sequence[float] | torch.Tensor | None = None) -> Path | None:
        """Save a batch: images as a grid PNG; video as a first-frame grid PNG plus an animated
        GIF and a frame grid per sample (the first ``nrow``); audio as one WAV per sample (the
        first ``nrow``). Also writes ``<name>_<step>.json``: the prompt and score of every saved
        sample and the files that hold it (what ``flowgrpo report`` shows).

        Args:
            nrow: samples per grid row (the eval puts one prompt's samples on a row).
            prompts: the prompt of each row, or of each sample; with ``scores``, the grid gets
                the prompt above each row and the score under each sample (None: no labels).
            scores: one reward per sample.
        """
        if not self.enabled:
            return None
        folder = self.run_dir / "samples"
        stem = f"{name}_{step:05d}"
        texts = _sample_prompts(prompts, len(media), nrow)
        values = None if scores is None else [float(v) for v in torch.as_tensor(scores).flatten()]
        if values is not None and len(values) != len(media):
            raise ValueError(f"{len(values)} scores for {len(media)} samples")
        files: dict[int, list[str]] = {}
        if kind == "audio":
            from pipelines.media_io import save_wav

            for i, clip in enumerate(media[:nrow]):
                files[i] = [save_wav(clip, sample_rate, folder / f"{stem}_{i}.wav").name]
            _write_index(folder / f"{stem}.json", step, kind, nrow, None, texts, values, files,
                         count=min(nrow, len(media)))
            return folder
        if kind == "video":
            from pipelines.media_io import save_video

            for i, video in enumerate(media[:nrow]):
                files[i] = [f.name for f in save_video(video, folder / f"{stem}_{i}")]
        from torchvision.utils import make_grid

        images = media[:, 0] if kind == "video" else media
        if images.shape[-1] < 64:  # tiny images (the toy's 16 px) are enlarged to be seen
            factor = -(-64 // images.shape[-1])
            images = torch.nn.functional.interpolate(images.float(), scale_factor=factor,
                                                     mode="nearest")
        path = folder / f"{stem}.png"
        grid = make_grid(images.float().cpu(), nrow=nrow, padding=1)
        if texts is None and values is None:
            picture = _to_pil(grid)
        else:
            picture = label_grid(grid, images.shape[-2:], nrow, len(images),
                                 _row_labels(texts, len(images), nrow), values)
        picture.save(path)
        _write_index(folder / f"{stem}.json", step, kind, nrow, path.name, texts, values, files,
                     count=len(media))
        if self._tb is not None:
            import numpy as np

            array = torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)
            self._tb.add_image(name, array.float() / 255, step)
        return path

    def close(self) -> None:
        if self.enabled:
            self._metrics.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()


def _sample_prompts(prompts: list[str] | None, count: int, nrow: int) -> list[str] | None:
    """One prompt per sample from ``prompts`` given per sample or per row of ``nrow``."""
    if prompts is None:
        return None
    rows = -(-count // max(nrow, 1))
    if len(prompts) == count:
        return [str(p) for p in prompts]
    if len(prompts) == rows:
        return [str(prompts[i // nrow]) for i in range(count)]
    raise ValueError(f"{len(prompts)} prompts for {count} samples in {rows} rows: give one per "
                     "row or one per sample")


def _row_labels(texts: list[str] | None, count: int, nrow: int) -> list[str] | None:
    """The label of each grid row: its prompt (a row that mixes prompts joins them)."""
    if texts is None:
        return None
    return [" | ".join(dict.fromkeys(texts[i:i + nrow])) for i in range(0, count, nrow)]


def _to_pil(grid: torch.Tensor):
    """A ``[3, H, W]`` grid in [0, 1] as an RGB PIL image, rounded as ``save_image`` does."""
    from PIL import Image

    array = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8)
    return Image.fromarray(array.numpy())


def _font():
    """PIL's built-in bitmap font (6 x 11 px per character; nothing is downloaded)."""
    from PIL import ImageFont

    load = getattr(ImageFont, "load_default_imagefont", ImageFont.load_default)
    return load()


def _printable(text: str) -> str:
    """``text`` in the bitmap font's Latin-1 range (other characters become ``?``)."""
    return text.encode("latin-1", "replace").decode("latin-1")


def render_text(text: str, scale: int = 1, color: tuple[int, int, int] = (0, 0, 0),
                background: tuple[int, int, int] = (255, 255, 255)):
    """One line of ``text`` in the bitmap font, enlarged ``scale`` times (a PIL image)."""
    from PIL import Image, ImageDraw

    font, text = _font(), _printable(text)
    height = font.getbbox("Agy|")[3] + 1
    image = Image.new("RGB", (max(int(font.getlength(text)), 1), height), background)
    ImageDraw.Draw(image).text((0, 0), text, fill=color, font=font)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    return image


def _wrap(text: str, width: int, max_lines: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters (words kept whole when they fit); the
    last of ``max_lines`` ends with ``...`` when text is left over."""
    lines = textwrap.wrap(" ".join(text.split()), width, break_long_words=True) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:max(width - 3, 0)].rstrip() + "..."
    return lines


def text_scale(cell_width: int) -> int:
    """How many times the 6 x 11 px font is enlarged next to images ``cell_width`` px wide (1
    up to 240 px, so a 512 px image gets 3x text)."""
    return max(1, round(cell_width / 160))


def label_grid(grid: torch.Tensor, cell: tuple[int, int], nrow: int, count: int,
               row_labels: list[str] | None, scores: list[float] | None, padding: int = 1,
               max_lines: int = 3):
    """The grid of :func:`torchvision.utils.make_grid` with each row's label above it and each
    sample's score under it (a PIL image, taller than the grid, at least 40 characters wide).

    Args:
        grid: ``[3, H, W]`` in [0, 1], made with ``nrow`` and ``padding``.
        cell: height and width of one sample in the grid.
        count: the number of samples in the grid.
        row_labels: one text per row (None: no label strips).
        scores: one value per sample (None: no score strips).
        max_lines: a longer label is cut with ``...``.
    """
    from PIL import Image

    picture = _to_pil(grid)
    h, w = int(cell[0]), int(cell[1])
    columns, rows = min(nrow, count), -(-count // nrow)
    scale = text_scale(w)
    char_w, line_h = 6 * scale, render_text("A", scale).height
    pad = 2 * scale
    width = max(picture.width, 40 * char_w + 2 * pad)
    wrapped = [_wrap(_printable(t), (width - 2 * pad) // char_w, max_lines)
               for t in row_labels] if row_labels is not None else None
    label_h = max(len(ls) for ls in wrapped) * line_h + 2 * pad if wrapped else 0
    score_h = line_h + 2 * pad if scores is not None else 0
    band = h + 2 * padding  # one row of the grid with the lines above and below it
    canvas = Image.new("RGB", (width, rows * (label_h + band + score_h)), (255, 255, 255))
    for r in range(rows):
        top = r * (label_h + band + score_h)
        if wrapped:
            for k, line in enumerate(wrapped[r]):
                canvas.paste(render_text(line, scale), (pad, top + pad + k * line_h))
        y = r * (h + padding)
        canvas.paste(picture.crop((0, y, picture.width, y + band)), (0, top + label_h))
        if scores is None:
            continue
        for c in range(columns):
            i = r * nrow + c
            if i >= count:
                break
            text = render_text(f"{scores[i]:.3g}", scale)
            x = padding + c * (w + padding) + (w - text.width) // 2
            canvas.paste(text, (max(x, 0), top + label_h + band + pad))
    return canvas


def _write_index(path: Path, step: int, kind: str, nrow: int, grid: str | None,
                 texts: list[str] | None, values: list[float] | None,
                 files: dict[int, list[str]], count: int) -> None:
    """``<name>_<step>.json``: the prompt, score and files of each saved sample, in grid order
    (non-finite scores are null)."""
    items = [{"prompt": texts[i] if texts is not None else None,
              "score": (float(f"{values[i]:.6g}") if values is not None
                        and math.isfinite(values[i]) else None),
              "files": files.get(i, [])} for i in range(count)]
    path.write_text(json.dumps({"step": step, "kind": kind, "nrow": nrow, "grid": grid,
                                "items": items}, indent=1) + "\n")


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item()
    value = float(value)
    return None if math.isnan(value) else value


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
