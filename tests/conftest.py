"""Shared fixtures: tiny pipelines saved as diffusers folders, a test-only reward."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory):
    """A tiny random StableDiffusion3Pipeline saved to disk (loads via from_pretrained)."""
    from tiny import tiny_sd3_pipeline

    path = tmp_path_factory.mktemp("tiny-sd3")
    tiny_sd3_pipeline().save_pretrained(str(path))
    return str(path)


def register_brightness() -> str:
    """Register ``brightness_test``: the mean pixel value of images (frames averaged)."""
    from reward_models import RewardOutput, register
    from reward_models.media import as_frames, average_frames

    def factory():
        def reward(media, prompts, metadata):
            frames, per = as_frames(media)
            return RewardOutput(average_frames(frames.mean(dim=(1, 2, 3)), per))

        return reward

    register("brightness_test")(factory)
    return "brightness_test"


def write_tiny_config(folder, model_dir: str, reward: str, **run) -> str:
    """A YAML config of a tiny run in ``folder`` (LoRA rank 4, groups of 4, 8 samples, 4 steps,
    one eval image per prompt, no progress bar, run folder ``folder/run``); ``run`` overrides
    the run section. Returns its path."""
    import yaml

    cfg = {
        "model": {"path": model_dir, "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": reward},
        "data": {"eval_images_per_prompt": 1},
        "train": {"group_size": 4, "batch_size": 8},
        "sampler": {"num_steps": 4},
        "run": {"epochs": 2, "progress": False, "output_dir": str(folder / "run"), **run},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def brightness_reward():
    """``brightness_test`` registered for the duration of a test."""
    from reward_models import REWARDS

    yield register_brightness()
    REWARDS._items.pop("brightness_test")


@pytest.fixture(autouse=True)
def reset_console():
    """A test that runs the ``flowgrpo`` command (which sets the console level, its log filters
    and the libraries' bars) leaves the next test the process as it was."""
    yield
    from flowgrpo import console

    if console._configured:
        console.reset()
