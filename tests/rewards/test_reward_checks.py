"""``check_output``: a reward's output with the wrong size or NaN/inf scores raises RewardFault."""

from __future__ import annotations

import pytest
import torch

import reward_models
from flowgrpo.errors import FlowgrpoError
from reward_models import RewardFault, RewardOutput, check_output


def fault(out: RewardOutput, n: int, name: str = "digit", **kw) -> RewardFault:
    with pytest.raises(RewardFault) as info:
        check_output(name, out, n, **kw)
    return info.value


def test_a_good_output_passes_unchanged():
    out = RewardOutput(torch.rand(4), regions=torch.rand(4, 2, 2),
                       components={"a": torch.rand(4)}, info={"x": 1.0})
    assert check_output("digit", out, 4) is out
    assert check_output("digit", RewardOutput(torch.zeros(0)), 0).scores.numel() == 0


def test_reward_fault_is_a_one_line_flowgrpo_error():
    assert reward_models.RewardFault is RewardFault
    err = RewardFault("ocr", "ocr broke\non two lines", bad=torch.tensor([True, False]))
    assert isinstance(err, FlowgrpoError) and err.exit_code == 1
    assert str(err) == "ocr broke on two lines" and err.reward == "ocr"
    assert err.bad.tolist() == [True, False]


def test_wrong_number_or_shape_of_scores():
    err = fault(RewardOutput(torch.rand(15)), 16)
    assert str(err) == "digit returned 15 scores for 16 samples"
    assert err.reward == "digit" and err.bad is None
    assert str(fault(RewardOutput(torch.rand(4, 1)), 4)) == (
        "digit returned scores of shape [4, 1] for 4 samples")
    assert str(fault(RewardOutput([0.5] * 4), 4)) == (
        "digit returned scores of type list, not a tensor")
    out = RewardOutput(torch.rand(4), components={"ocr": torch.rand(3)})
    assert str(fault(out, 4, "mix")) == "mix returned 3 scores for 4 samples in component 'ocr'"
    out = RewardOutput(torch.rand(4), regions=torch.rand(3, 2, 2))
    assert str(fault(out, 4)) == "digit returned regions of shape [3, 2, 2] for 4 samples"
    assert check_output("digit", RewardOutput(torch.full((4,), float("nan"))), 4,
                        finite=False).scores.isnan().all()  # sizes only
    assert str(fault(RewardOutput(torch.rand(3)), 4, finite=False)) == (
        "digit returned 3 scores for 4 samples")


def test_nan_and_inf_are_counted_per_sample_and_masked():
    scores = torch.rand(64)
    scores[[1, 5, 9]] = float("nan")
    err = fault(RewardOutput(scores), 64)
    assert str(err) == "digit returned 3 NaN of 64"
    assert err.bad.dtype == torch.bool and err.bad.nonzero().flatten().tolist() == [1, 5, 9]

    scores = torch.rand(64)
    scores[[0, 63]] = torch.tensor([float("inf"), float("-inf")])
    err = fault(RewardOutput(scores), 64)
    assert str(err) == "digit returned 2 inf of 64"
    assert err.bad.nonzero().flatten().tolist() == [0, 63]

    scores = torch.rand(64)
    scores[[2, 3, 4]] = float("nan")
    scores[7] = float("inf")
    components = {"ocr": torch.rand(64)}
    components["ocr"][2] = float("inf")  # NaN in scores wins: sample 2 counts once, as NaN
    err = fault(RewardOutput(scores, components=components), 64)
    assert str(err) == "digit returned 3 NaN and 1 inf of 64 (in 'ocr')"
    assert err.bad.nonzero().flatten().tolist() == [2, 3, 4, 7]


def test_non_finite_components_and_regions_are_named():
    components = {"clip": torch.rand(4), "ocr": torch.rand(4)}
    components["ocr"][1] = float("nan")
    err = fault(RewardOutput(torch.rand(4), components=components), 4, "mix")
    assert str(err) == "mix returned 1 NaN of 4 (in 'ocr')"
    assert err.bad.tolist() == [False, True, False, False]

    regions = torch.rand(4, 2, 2)
    regions[3, 1, 0] = float("inf")
    err = fault(RewardOutput(torch.rand(4), regions=regions), 4, "region")
    assert str(err) == "region returned 1 inf of 4 (in regions)"
    assert err.bad.tolist() == [False, False, False, True]
