"""The video toy's reward, ``digit_motion``: the digit of every frame and its motion the asked way.

Real held-out digits moved by :func:`moving_digits` (how the toy's training clips are made) score
near the top; the same clips played backwards, frozen, or asked for another digit score lower,
each term for its own reason.
"""

from __future__ import annotations

import pytest
import torch

import reward_models
from pipelines.toy import VIDEO_DIRECTIONS, digit_video_prompt
from reward_models import Media
from reward_models.digits import (
    DIRECTIONS,
    digit_crops,
    frame_centroids,
    load_digit_split,
    moving_digits,
    target_directions,
)


@pytest.fixture(scope="module")
def clips() -> tuple[torch.Tensor, list[int], list[str]]:
    """One held-out example of every digit, each in every direction: 40 clips."""
    _, _, grids, labels = load_digit_split()
    first = [int(torch.nonzero(labels == d)[0]) for d in range(10)]
    names = [n for n in DIRECTIONS for _ in range(10)]
    digits = [d for _ in DIRECTIONS for d in range(10)]
    video = moving_digits(grids[first * len(DIRECTIONS)], names)
    return video, digits, names


def score(video: torch.Tensor, digits: list[int], names: list[str], **params):
    reward = reward_models.get("digit_motion", **params)
    prompts = [digit_video_prompt(d, n) for d, n in zip(digits, names)]
    return reward(Media("video", video), prompts, [{} for _ in prompts])


def test_the_toy_and_the_reward_name_the_same_directions():
    assert set(VIDEO_DIRECTIONS) == set(DIRECTIONS)


def test_real_moving_digits_score_near_the_top(clips):
    video, digits, names = clips
    out = score(video, digits, names)
    assert out.scores.shape == (40,) and out.scores.dtype == torch.float32
    assert out.info["motion"] == pytest.approx(1.0)
    assert out.info["digit"] > 0.8 and out.info["accuracy"] > 0.8
    assert out.scores.mean() > 0.9


def test_backwards_or_frozen_clips_get_no_motion_and_keep_their_digit(clips):
    video, digits, names = clips
    forward = score(video, digits, names)
    backwards = score(video.flip(1), digits, names)
    frozen = score(video[:, :1].expand_as(video).contiguous(), digits, names)
    for out in (backwards, frozen):
        assert out.info["motion"] == 0.0
        assert out.info["digit"] == pytest.approx(forward.info["digit"], abs=0.05)
        assert (out.scores < forward.scores).all()


def test_the_wrong_direction_scores_no_motion(clips):
    video, digits, names = clips
    opposite = {"right": "left", "left": "right", "up": "down", "down": "up"}
    across = {"right": "down", "left": "up", "up": "right", "down": "left"}
    for swap in (opposite, across):
        out = score(video, digits, [swap[n] for n in names])
        assert out.info["motion"] == 0.0


def test_asking_for_another_digit_lowers_the_digit_term(clips):
    video, digits, names = clips
    right = score(video, digits, names)
    wrong = score(video, [(d + 1) % 10 for d in digits], names)
    assert wrong.info["digit"] < right.info["digit"] - 0.5
    assert wrong.info["motion"] == right.info["motion"]


@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_the_score_mixes_the_terms_by_motion_weight(clips, weight):
    video, digits, names = clips
    half = video.clone()
    half[:, 3:] = half[:, 2:3]  # stops halfway: motion 0.5
    out = score(half, digits, names, motion_weight=weight)
    digit_only = score(half, digits, names, motion_weight=0.0).scores
    assert out.info["motion"] == pytest.approx(0.5)
    torch.testing.assert_close(out.scores, (1 - weight) * digit_only + weight * 0.5)


def test_a_crop_follows_the_digit_and_the_centroid_is_the_mass_centre(clips):
    video, *_ = clips
    frames = video[0]  # digit 0 moving right: [5, 3, 16, 16]
    crops = digit_crops(frames)
    assert crops.shape == (5, 3, 8, 8)
    torch.testing.assert_close(crops, crops[:1].expand_as(crops))  # the same digit each frame
    dot = torch.zeros(1, 3, 16, 16)
    dot[0, :, 5, 11] = 1.0
    torch.testing.assert_close(frame_centroids(dot), torch.tensor([[5.0, 11.0]]))
    torch.testing.assert_close(frame_centroids(torch.zeros(1, 3, 16, 16)),
                               torch.tensor([[7.5, 7.5]]))


def test_directions_come_from_metadata_before_the_prompt():
    prompts = [digit_video_prompt(3, "left"), "a handwritten digit 3"]
    assert target_directions(prompts, [{}, {"direction": "up"}]) == ["left", "up"]
    with pytest.raises(ValueError, match="which way"):
        target_directions(["a handwritten digit 3"], [{}])
    with pytest.raises(ValueError, match="direction must be one of"):
        target_directions(["x"], [{"direction": "sideways"}])


def test_images_and_bad_weights_are_refused():
    reward = reward_models.get("digit_motion")
    with pytest.raises(ValueError, match="video"):
        reward(Media("image", torch.zeros(1, 3, 16, 16)), ["a handwritten digit 1 moving up"],
               [{}])
    with pytest.raises(ValueError, match="motion_weight"):
        reward_models.get("digit_motion", motion_weight=1.5)
