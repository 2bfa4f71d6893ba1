"""``RewardOutput.cat``: the outputs of a batch's chunks as one output."""

from __future__ import annotations

import torch

from reward_models import RewardOutput


def test_chunks_concatenate_and_info_is_the_size_weighted_mean():
    a = RewardOutput(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.ones(2, 3, 3),
                     {"x": torch.tensor([0.5, 0.25])}, {"acc": 1.0})
    b = RewardOutput(torch.tensor([3.0]), torch.zeros(1, 3, 3), {"x": torch.tensor([1.0])},
                     {"acc": 0.0})
    out = RewardOutput.cat([a, b])
    assert out.scores.dtype == torch.float32 and out.scores.tolist() == [1.0, 2.0, 3.0]
    assert out.regions.shape == (3, 3, 3) and out.regions[2].sum() == 0
    assert out.components["x"].tolist() == [0.5, 0.25, 1.0]
    assert abs(out.info["acc"] - 2 / 3) < 1e-6


def test_optional_fields_stay_empty():
    out = RewardOutput.cat([RewardOutput(torch.ones(2)), RewardOutput(torch.zeros(1))])
    assert out.regions is None and out.components is None and out.info == {}
