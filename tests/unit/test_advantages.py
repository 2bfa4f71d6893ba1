"""Group-relative advantages against hand computations (population std, ddof = 0)."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.registry import UnknownNameError
from flowgrpo.rl import advantages
from flowgrpo.rl.advantages import ADVANTAGES, compute_advantages, zero_std_groups

EPS = 1e-4


def test_registry_holds_the_estimators():
    assert ADVANTAGES.names() == ["a_grae", "dual_anchor", "focal", "global_std", "group", "none",
                                  "rcc"]
    assert advantages.get("group") is advantages.group_advantages


def test_group_zero_mean_unit_population_std_per_group():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen)
    groups = torch.tensor([7, 3, 7, 3, 7, 3, 9, 9, 9, 7, 3, 9])  # unsorted, non-contiguous ids
    adv = advantages.get("group")(rewards, groups, eps=0.0)
    for g in groups.unique():
        a = adv[groups == g]
        assert a.mean().abs() < 1e-6
        assert a.std(correction=0) == pytest.approx(1.0, abs=1e-5)


def test_group_matches_hand_computation():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 4.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    std0 = math.sqrt(2.0 / 3.0)  # population std of 1, 2, 3
    expected = [-1 / (std0 + EPS), 0.0, 1 / (std0 + EPS), -2 / (2 + EPS), 2 / (2 + EPS)]
    adv = advantages.get("group")(rewards, groups)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_zero_std_groups_get_zero_and_are_counted():
    # 2.9 three times: its float32 mean is not exactly 2.9, yet the advantages must be exactly 0.
    rewards = torch.tensor([2.9, 2.9, 2.9, 0.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])  # group 2 has a single sample: no preference
    for name in ADVANTAGES.names():
        adv = advantages.get(name)(rewards, groups)
        assert torch.equal(adv[[0, 1, 2, 5]], torch.zeros(4)), name
        assert adv[3] < 0 < adv[4]
    mask = zero_std_groups(rewards, groups)
    assert mask.tolist() == [True, True, True, False, False, True]
    _, metrics = compute_advantages(rewards, groups)
    assert metrics["rollout/zero_std_frac"] == pytest.approx(2 / 3)


def test_global_std_uses_the_batch_population_std():
    rewards = torch.tensor([1.0, 3.0, 10.0, 20.0])
    groups = torch.tensor([0, 0, 1, 1])
    batch_std = rewards.numpy().std()  # numpy's default is the population std
    expected = torch.tensor([-1.0, 1.0, -5.0, 5.0]) / (float(batch_std) + EPS)
    torch.testing.assert_close(advantages.get("global_std")(rewards, groups), expected)


def test_none_is_mean_centred_only():
    rewards = torch.tensor([1.0, 3.0, 10.0, 20.0])
    groups = torch.tensor([0, 0, 1, 1])
    adv = advantages.get("none")(rewards, groups)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -5.0, 5.0]))


def test_clipping_and_metrics():
    rewards = torch.tensor([1.0, 3.0, 10.0, 20.0])
    groups = torch.tensor([0, 0, 1, 1])
    adv, metrics = compute_advantages(rewards, groups, estimator="none", adv_clip=2.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    assert metrics["rollout/adv_clipped_frac"] == pytest.approx(0.5)
    assert metrics["rollout/adv_abs_mean"] == pytest.approx(1.5)
    assert metrics["rollout/zero_std_frac"] == 0.0
    for off in (None, 0):
        adv, metrics = compute_advantages(rewards, groups, estimator="none", adv_clip=off)
        torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -5.0, 5.0]))
        assert metrics["rollout/adv_clipped_frac"] == 0.0


def test_sum_then_normalize_matches_hand_computation():
    rewards = {"a": torch.tensor([0.0, 1.0, 1.0, 1.0]), "b": torch.tensor([2.0, 0.0, 0.0, 4.0])}
    groups = torch.tensor([0, 0, 1, 1])
    # mixed = a + 0.5 b = [1, 1, 1, 3]: group 0 constant, group 1 is [-1, 1] / (1 + eps).
    adv, metrics = compute_advantages(rewards, groups, weights={"a": 1.0, "b": 0.5})
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, -1.0, 1.0]) / (1 + EPS))
    assert metrics["rollout/zero_std_frac"] == pytest.approx(0.5)


def test_normalize_then_sum_matches_hand_computation():
    rewards = {"a": torch.tensor([0.0, 1.0, 1.0, 1.0]), "b": torch.tensor([2.0, 0.0, 0.0, 4.0])}
    groups = torch.tensor([0, 0, 1, 1])
    weights = {"a": 1.0, "b": 0.5}
    # Each reward normalized in its groups: a's group 1 is constant; b's group stds are 1 and 2.
    a = torch.tensor([-0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS), 0.0, 0.0])
    b = torch.tensor([1 / (1 + EPS), -1 / (1 + EPS), -2 / (2 + EPS), 2 / (2 + EPS)])
    summed = 1.0 * a + 0.5 * b
    expected = summed / (float(summed.numpy().std()) + EPS)  # GDPO batch renormalization
    adv, metrics = compute_advantages(
        rewards, groups, weights=weights, aggregation="normalize_then_sum"
    )
    torch.testing.assert_close(adv, expected)
    # Group 0 keeps a preference that the summed reward (constant there) would have erased.
    assert adv[0] != 0
    assert metrics["rollout/zero_std_frac"] == 0.0


def test_normalize_then_sum_counts_groups_constant_in_every_weighted_reward():
    rewards = {"a": torch.tensor([1.0, 1.0, 0.0, 2.0]), "b": torch.tensor([0.0, 3.0, 1.0, 1.0])}
    groups = torch.tensor([0, 0, 1, 1])
    _, metrics = compute_advantages(
        rewards, groups, weights={"a": 1.0, "b": 0.0}, aggregation="normalize_then_sum"
    )
    assert metrics["rollout/zero_std_frac"] == pytest.approx(0.5)  # b varies but weighs 0
    assert zero_std_groups(rewards, groups).tolist() == [False] * 4


def test_single_tensor_equals_one_named_reward():
    rewards = torch.tensor([0.3, 0.9, 0.1, 0.2, 0.7, 0.4])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    plain, _ = compute_advantages(rewards, groups)
    named, _ = compute_advantages({"x": rewards}, groups)
    torch.testing.assert_close(plain, named)
    # A single tensor is a reward already mixed: the mix's weights do not apply twice.
    mixed, _ = compute_advantages(rewards, groups, estimator="none", weights={"a": 3.0})
    torch.testing.assert_close(mixed, compute_advantages(rewards, groups, estimator="none")[0])


def test_unknown_names_list_the_valid_ones():
    rewards, groups = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    with pytest.raises(UnknownNameError, match="global_std, group, none"):
        compute_advantages(rewards, groups, estimator="grop")
    with pytest.raises(ValueError, match="normalize_then_sum"):
        compute_advantages(rewards, groups, aggregation="average")


def test_bad_inputs_fail_with_the_fix_in_the_message():
    groups = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="missing: \\['b'\\]"):
        compute_advantages({"a": torch.ones(2), "b": torch.ones(2)}, groups, weights={"a": 1.0})
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([0.0, float("nan")]), groups)
    with pytest.raises(ValueError, match="shape"):
        compute_advantages(torch.ones(3), groups)
    with pytest.raises(ValueError, match="integer"):
        compute_advantages(torch.ones(2), groups.float())
