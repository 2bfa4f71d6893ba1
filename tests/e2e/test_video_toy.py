"""The shipped video toy (configs/digits_video.yaml): a tiny ``WanPipeline`` of moving digits,
loaded through the ``wan`` family by its short name, that GRPO teaches from the CLI, with the
eval videos in the report as GIFs before and after."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import pipelines
import reward_models
from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config
from flowgrpo.data.prompts import load_prompts
from flowgrpo.run.tracking import read_metrics
from flowgrpo.training.hub import resolve_path
from helpers import ROOT
from pipelines.toy import (
    DIGITS_VIDEO_MODEL,
    VIDEO_FRAMES,
    VIDEO_MAX_SEQUENCE_LENGTH,
    VIDEO_SIZE,
)
from reward_models import Media

CONFIG = str(ROOT / "configs" / "digits_video.yaml")
QUIET = ["run.tensorboard=false", "run.progress=false"]


@pytest.fixture(scope="module")
def adapter():
    folder = resolve_path("digits_video")
    assert folder == DIGITS_VIDEO_MODEL and Path(folder).is_dir()
    return pipelines.load("wan", folder, height=VIDEO_SIZE, width=VIDEO_SIZE,
                          num_frames=VIDEO_FRAMES, max_sequence_length=VIDEO_MAX_SEQUENCE_LENGTH)


def test_the_config_runs_the_toy_through_the_wan_family():
    cfg = load_config(CONFIG, [])
    assert cfg.model.family == "wan" and resolve_path(cfg.model.path) == DIGITS_VIDEO_MODEL
    assert cfg.reward.name == "digit_motion" and cfg.data.prompts == "digits_video"
    prompts = load_prompts(cfg.data.prompts)
    assert len(prompts) == 40 and len({p for p, _ in prompts}) == 40
    assert all(set(m) == {"digit", "direction"} for _, m in prompts)


def test_the_shipped_model_makes_videos_the_reward_reads_with_room_to_rise(adapter):
    assert adapter.latent_shape() == (4, 3, VIDEO_SIZE // 2, VIDEO_SIZE // 2)
    prompts = load_prompts("digits_video")
    cond = adapter.encode([p for p, _ in prompts])
    x = adapter.noise(len(prompts), torch.Generator().manual_seed(0))
    sigmas = adapter.schedule(10)
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + (s_next - s) * adapter.velocity(x, s, cond, 1.0)
    video = adapter.decode(x)
    assert video.shape == (40, VIDEO_FRAMES, 3, VIDEO_SIZE, VIDEO_SIZE)
    out = reward_models.get("digit_motion")(Media("video", video), [p for p, _ in prompts],
                                            [m for _, m in prompts])
    assert 0.15 < out.scores.mean() < 0.85  # the base model: above nothing, below the top
    assert out.info["motion"] > 0.3  # it has learnt to move the digit the asked way


def _eval(run: Path) -> list[float]:
    return [r["eval/reward"] for r in read_metrics(run) if "eval/reward" in r]


@pytest.mark.slow
def test_grpo_from_the_cli_raises_the_eval_reward_and_the_report_shows_gifs(tmp_path, capsys):
    run = tmp_path / "run"
    overrides = [f"run.output_dir={run}", *QUIET, "run.epochs=60", "run.eval_every=60",
                 "run.save_every=0"]
    assert main(["train", CONFIG, "-q", *(a for o in overrides for a in ("--set", o))]) == 0
    base, final = _eval(run)
    assert final > base + 0.015, (base, final)
    gifs = {int(m[1]) for p in (run / "samples").glob("*.gif")
            if (m := re.fullmatch(r"eval_(\d+)_\d+\.gif", p.name))}
    assert gifs == {0, 60}, gifs
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    shown = {int(n) for n in re.findall(r"eval_(\d+)_\d+\.gif", html)}
    assert shown == {0, 60}, shown  # the base and the last eval, as GIFs
