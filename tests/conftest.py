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


@pytest.fixture
def brightness_reward():
    """``brightness_test`` registered for the duration of a test."""
    from reward_models import REWARDS

    yield register_brightness()
    REWARDS._items.pop("brightness_test")
