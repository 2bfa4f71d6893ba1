"""Shared fixtures: a tiny SD3 pipeline saved as a diffusers folder, a test-only reward, the
console reset between tests. What the tests share that is not a fixture lives in
``tests/helpers``."""

from __future__ import annotations

import os

import pytest
import torch

# The helpers assert too (the toy job's ratio check): pytest explains their failures as well.
pytest.register_assert_rewrite("helpers")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory):
    """A tiny random StableDiffusion3Pipeline saved to disk (loads via from_pretrained)."""
    from helpers.tiny import tiny_sd3_pipeline

    path = tmp_path_factory.mktemp("tiny-sd3")
    tiny_sd3_pipeline().save_pretrained(str(path))
    return str(path)


@pytest.fixture
def brightness_reward():
    """``brightness_test`` registered for the duration of a test."""
    from helpers.tiny_runs import register_brightness
    from reward_models import REWARDS

    with REWARDS.snapshot():
        yield register_brightness()


@pytest.fixture(autouse=True)
def reset_console():
    """A test that runs the ``flowgrpo`` command (which sets the console level, its log filters
    and the libraries' bars) leaves the next test the process as it was."""
    yield
    from flowgrpo import console

    if console._configured:
        console.reset()
