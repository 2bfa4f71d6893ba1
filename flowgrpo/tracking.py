"""The run directory: resolved config, metrics (JSON lines + TensorBoard/W&B), sample media.

Layout::

    RUN/config.yaml          the resolved config
    RUN/metrics.jsonl        one JSON object per training step (epoch): step, reward/mean, ...
    RUN/tb/                  TensorBoard events
    RUN/samples/             eval grids (PNG), videos (GIF), audio (WAV)
    RUN/checkpoints/step_N/  see flowgrpo.checkpoint
"""

from __future__ import annotations

import json
import math
import time
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
    :func:`flowgrpo.resume.truncate_metrics` before the tracker opens it)."""

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
                   sample_rate: int | None = None, nrow: int = 8) -> Path | None:
        """Save a batch: images as a grid PNG; video as a first-frame grid PNG plus an animated
        GIF and a frame grid per sample (the first ``nrow``); audio as one WAV per sample."""
        if not self.enabled:
            return None
        folder = self.run_dir / "samples"
        if kind == "audio":
            from pipelines.media_io import save_wav

            for i, clip in enumerate(media[:nrow]):
                save_wav(clip, sample_rate, folder / f"{name}_{step:05d}_{i}.wav")
            return folder
        if kind == "video":
            from pipelines.media_io import save_video

            for i, video in enumerate(media[:nrow]):
                save_video(video, folder / f"{name}_{step:05d}_{i}")
        from torchvision.utils import save_image

        images = media[:, 0] if kind == "video" else media
        if images.shape[-1] < 64:  # tiny images (the toy's 16 px) are enlarged to be seen
            factor = -(-64 // images.shape[-1])
            images = torch.nn.functional.interpolate(images.float(), scale_factor=factor,
                                                     mode="nearest")
        path = folder / f"{name}_{step:05d}.png"
        save_image(images.float().cpu(), path, nrow=nrow, padding=1)
        if self._tb is not None:
            from torchvision.utils import make_grid

            self._tb.add_image(name, make_grid(images.float().cpu(), nrow=nrow), step)
        return path

    def close(self) -> None:
        if self.enabled:
            self._metrics.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item()
    value = float(value)
    return None if math.isnan(value) else value


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
