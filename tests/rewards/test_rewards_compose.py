"""Rewards built from rewards: regions, group-wise win rate / rank, weighted mixes."""

from __future__ import annotations

import pytest
import torch

import reward_models
from flowgrpo.registry import UnknownNameError
from reward_models import Media, RewardOutput
from reward_models.groupwise import normalized_ranks, win_rates
from reward_models.media import as_frames, average_frames
from reward_models.mix import Mix, build_reward
from reward_models.ocr import render_text


class Brightness:
    """Mean pixel value per sample (a deterministic stand-in for a model reward)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self, media, prompts, metadata):
        frames, per = as_frames(media)
        scores = average_frames(frames.mean(dim=(1, 2, 3)), per) + self.offset
        return RewardOutput(scores, info={"calls": 1.0})


def quadrant_image(dark: tuple[int, int] | None) -> torch.Tensor:
    """64x64 white image with one 32x32 quadrant (row, col) black."""
    image = torch.ones(3, 64, 64)
    if dark is not None:
        r, c = dark
        image[:, 32 * r : 32 * (r + 1), 32 * c : 32 * (c + 1)] = 0
    return image


QUADRANTS = [[0, 0, 0.5, 0.5], [0.5, 0, 1, 0.5], [0, 0.5, 0.5, 1], [0.5, 0.5, 1, 1]]


def test_region_lowers_only_the_bad_region():
    """Only the dark quadrant's cells score low; uncovered cells get the whole-image score."""
    images = torch.stack([quadrant_image((1, 1)), quadrant_image((1, 1))])
    meta = [{"boxes": QUADRANTS}, {"boxes": [[0, 0, 1, 0.5]]}]  # second: top half only
    reward = reward_models.get("region", inner=Brightness(), grid=(4, 4))
    out = reward(Media("image", images), ["p", "p"], meta)
    assert out.regions.shape == (2, 4, 4)
    bad = torch.zeros(4, 4, dtype=torch.bool)
    bad[2:, 2:] = True
    assert torch.equal(out.regions[0][bad], torch.zeros(4))
    assert torch.equal(out.regions[0][~bad], torch.ones(12))
    whole = images[1].mean()
    torch.testing.assert_close(out.regions[1, :2], torch.ones(2, 4))  # the box: all white
    torch.testing.assert_close(out.regions[1, 2:], whole.expand(2, 4))  # outside: whole image
    torch.testing.assert_close(out.scores, out.regions.mean(dim=(1, 2)))
    inner_scores = reward_models.get("region", inner=Brightness(), grid=(4, 4), score="inner")
    torch.testing.assert_close(
        inner_scores(Media("image", images), ["p", "p"], meta).scores, images.mean(dim=(1, 2, 3))
    )


def test_region_masks_and_box_validation():
    image = quadrant_image((0, 1))[None]
    mask = torch.zeros(8, 8)
    mask[:4, 4:] = 1  # the dark quadrant (top right)
    reward = reward_models.get("region", inner=Brightness(), grid=(2, 2))
    out = reward(Media("image", image), ["p"], [{"masks": [mask]}])
    torch.testing.assert_close(out.regions[0], torch.tensor([[0.75, 0.0], [0.75, 0.75]]))
    with pytest.raises(ValueError, match="x0 < x1"):
        reward(Media("image", image), ["p"], [{"boxes": [[0.5, 0, 0.2, 1]]}])


def test_region_with_real_ocr_finds_the_misspelled_sign():
    """Two signs side by side, per-box targets; the box whose text is wrong scores low."""
    left, right = render_text("OPEN", (128, 128)), render_text("CLOSED", (128, 128))
    image = torch.cat([left, right], dim=2)[None]  # [1, 3, 128, 256]
    meta = [{"boxes": [[0, 0, 0.5, 1], [0.5, 0, 1, 1]],
             "box_metadata": [{"text": "OPEN"}, {"text": "HOURS"}], "text": "OPEN CLOSED"}]
    reward = reward_models.get("region", inner="ocr", inner_params={"threads": 1}, grid=(2, 4))
    out = reward(Media("image", image), ["two signs"], meta)
    assert (out.regions[0, :, :2] == 1).all()
    assert (out.regions[0, :, 2:] < 0.5).all()


def test_win_rate_and_rank_closed_form():
    scores = torch.tensor([1.0, 2.0, 2.0, 3.0])
    torch.testing.assert_close(win_rates(scores), torch.tensor([0.0, 0.5, 0.5, 1.0]))
    torch.testing.assert_close(normalized_ranks(scores), win_rates(scores))
    torch.testing.assert_close(normalized_ranks(scores, "min"), torch.tensor([0, 1 / 3, 1 / 3, 1]))
    torch.testing.assert_close(normalized_ranks(scores, "max"), torch.tensor([0, 2 / 3, 2 / 3, 1]))
    soft = win_rates(scores, temperature=1.0)
    assert (soft[1:] > soft[:-1]).sum() == 2 and soft[1] == soft[2]
    torch.testing.assert_close(win_rates(torch.tensor([5.0])), torch.tensor([0.5]))


def test_groupwise_rewards_rank_within_groups_only():
    """Interleaved groups are ranked separately; a missing group id is a clear error."""
    levels = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.3, 0.4])
    images = levels[:, None, None, None].expand(6, 3, 8, 8).contiguous()
    meta = [{"group": g} for g in ["a", "b", "a", "b", "a", "b"]]  # a: .1 .5 .3  b: .9 .2 .4
    for name in ("winrate", "rank"):
        reward = reward_models.get(name, inner=Brightness())
        assert reward.groupwise
        out = reward(Media("image", images), ["p"] * 6, meta)
        torch.testing.assert_close(out.scores, torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 0.5]))
    with pytest.raises(ValueError, match="group"):
        reward(Media("image", images), ["p"] * 6, [{} for _ in range(6)])


def test_mix_weights_components_and_unique_keys():
    images = torch.rand(3, 3, 8, 8)
    media, prompts, meta = Media("image", images), ["p"] * 3, [{}] * 3
    base = Brightness()(media, prompts, meta).scores
    mix = reward_models.get("mix", components=[
        {"name": Brightness(), "weight": 2.0, "key": "b"},
        {"name": Brightness(1.0), "weight": -1.0, "key": "b"},
    ])
    out = mix(media, prompts, meta)
    torch.testing.assert_close(out.scores, 2 * base - (base + 1))
    assert set(out.components) == {"b", "b_2"} and set(out.info) == {"b/calls", "b_2/calls"}
    torch.testing.assert_close(out.components["b_2"], base + 1)


def test_mix_of_regions_and_nested_mix():
    image = quadrant_image((0, 0))[None]
    region = reward_models.get("region", inner=Brightness(), grid=(2, 2))
    inner = Mix([{"name": Brightness(), "key": "flat"}])
    mix = Mix([{"name": region, "weight": 0.5, "key": "r"}, {"name": inner, "key": "m"}])
    out = mix(Media("image", image), ["p"], [{"boxes": QUADRANTS}])
    flat = image.mean()
    expected = 0.5 * torch.tensor([[0.0, 1.0], [1.0, 1.0]]) + flat
    torch.testing.assert_close(out.regions[0], expected)
    assert set(out.components) == {"r", "m", "m/flat"}


def test_build_reward_specs(brightness_reward):
    name = brightness_reward
    media, prompts, meta = Media("image", torch.rand(2, 3, 8, 8)), ["p", "q"], [{}, {}]
    plain = build_reward(name)
    assert not isinstance(plain, Mix)
    assert not isinstance(build_reward([{"name": name}]), Mix)
    assert isinstance(build_reward([{"name": name, "weight": 0.5}]), Mix)
    both = build_reward([{"name": name, "weight": 1.0}, {"name": name, "weight": 3.0}])
    torch.testing.assert_close(both(media, prompts, meta).scores,
                               4 * plain(media, prompts, meta).scores)
    short = build_reward({name: 2.0})
    assert set(short(media, prompts, meta).components) == {name}
    with pytest.raises(ValueError, match="unknown reward spec keys"):
        build_reward([{"name": name, "wieght": 2}])
    with pytest.raises(ValueError, match="valid names"):
        build_reward("no-such-reward")


class Constant:
    """Every sample scores ``value`` (tells which component a mixed score came from)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, media, prompts, metadata):
        return RewardOutput(torch.full((len(prompts),), self.value))


def sample_mix(weights: tuple[float, ...], seed: int = 0) -> Mix:
    return Mix([{"name": Constant(float(k)), "weight": w} for k, w in enumerate(weights)],
               mode="sample", seed=seed)


def training_metadata(n: int, iteration: int = 0, start: int = 0) -> list[dict]:
    return [{"group": (start + i) // 4, "iteration": iteration, "sample": start + i}
            for i in range(n)]


def test_sample_mode_scores_each_sample_by_one_reward_drawn_by_weight():
    mix = sample_mix((1.0, 3.0))
    n = 4000
    media = Media("image", torch.zeros(n, 3, 1, 1))
    out = mix(media, [""] * n, training_metadata(n))
    assert set(out.scores.unique().tolist()) <= {0.0, 1.0}  # one component's score, unweighted
    assert abs(out.scores.mean().item() - 0.75) < 0.03  # drawn with probability w / sum(w)
    assert torch.equal(out.components["Constant_2"], torch.ones(n))  # every part still logged
    weighted = Mix([{"name": Constant(0.0), "weight": 1.0},
                    {"name": Constant(1.0), "weight": 3.0}])
    scores = weighted(media, [""] * n, training_metadata(n)).scores
    assert torch.equal(scores, torch.full((n,), 3.0))


def test_sample_mode_draws_are_the_same_however_the_batch_is_split():
    """A sample's draw depends on the seed, its iteration and its global index only: the same on
    one process scoring 8 samples and on two scoring 4 each; other iterations and seeds draw
    again."""
    mix = sample_mix((1.0, 1.0, 1.0))
    media = Media("image", torch.zeros(8, 3, 1, 1))
    whole = mix(media, [""] * 8, training_metadata(8)).scores
    halves = torch.cat([mix(Media("image", torch.zeros(4, 3, 1, 1)), [""] * 4,
                            training_metadata(4, start=s)).scores for s in (0, 4)])
    assert torch.equal(whole, halves)
    n = 64
    big = Media("image", torch.zeros(n, 3, 1, 1))
    first = mix(big, [""] * n, training_metadata(n)).scores
    assert not torch.equal(first, mix(big, [""] * n, training_metadata(n, iteration=1)).scores)
    assert not torch.equal(first, sample_mix((1.0, 1.0, 1.0), seed=1)(
        big, [""] * n, training_metadata(n)).scores)


def test_sample_mode_refuses_negative_or_zero_weights_in_one_line():
    for weights in ((1.0, -1.0), (0.0, 0.0)):
        with pytest.raises(ValueError, match="proportional to its weight") as err:
            sample_mix(weights)
        assert "\n" not in str(err.value)
    with pytest.raises(UnknownNameError, match="mix mode"):
        Mix([{"name": Constant(0.0)}, {"name": Constant(1.0)}], mode="coin")


def test_sample_mode_from_the_config(tmp_path):
    from flowgrpo.config.io import load_config
    from flowgrpo.errors import ConfigError

    base = [f"run.output_dir={tmp_path}", "reward.mix_mode=sample",
            "reward.components=[{name: digit, weight: 1}, {name: jpeg_compressibility, "
            "weight: 2}]"]
    assert load_config(None, base).reward.mix_mode == "sample"
    with pytest.raises(ConfigError, match="reward.mix_mode"):
        load_config(None, [*base[:1], "reward.mix_mode=coin"])
    with pytest.raises(ConfigError, match="weights >= 0"):
        load_config(None, [*base[:2], "reward.components=[{name: digit, weight: 1}, "
                                      "{name: jpeg_compressibility, weight: -1}]"])
