"""DPPO pruning: unbiased (Monte Carlo), deterministic per generator, parameter errors."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.registry import UnknownNameError
from flowgrpo.rl import pruning
from flowgrpo.rl.advantages import group_advantages


def _batch(extra: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """6 groups of 4 (unsorted ids), group 5 constant (all-zero advantage), plus a sample with
    exactly zero advantage inside a non-constant group."""
    gen = torch.Generator().manual_seed(1)
    groups = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=gen)] * 3 + 2
    rewards = torch.rand(24, *extra, generator=gen)
    rewards[groups == 17] = 0.5
    rewards[(groups == 2).nonzero()[:3].flatten()] = torch.tensor([0.0, 1.0, 0.5]).reshape(
        (3,) + (1,) * len(extra))
    rewards[(groups == 2).nonzero()[3]] = 0.5  # group 2: 0, 1, 0.5, 0.5 -> two zero advantages
    return group_advantages(rewards, groups), groups


def test_registry_names_and_build():
    assert pruning.names() == ["dppo", "none"]
    assert isinstance(pruning.build("dppo", group_rate=0.3), pruning.DPPOPruner)
    with pytest.raises(UnknownNameError, match="valid names: dppo, none"):
        pruning.build("dpp")


@pytest.mark.parametrize("params, match", [
    ({"group_rate": 1.0}, "group_rate must be a number in \\[0, 1\\)"),
    ({"sample_rate": -0.1}, "sample_rate"),
    ({"sample_rate": "0.5"}, "sample_rate"),
    ({"level": "token"}, "level must be one of hierarchical, group, sample"),
    ({"drop_zero": 1}, "drop_zero"),
    ({"keep_frac": 0.5}, "unknown parameter 'keep_frac'"),
])
def test_bad_params_are_one_line_value_errors(params, match):
    with pytest.raises(ValueError, match=match) as info:
        pruning.build("dppo", **params)
    assert "\n" not in str(info.value)


def test_none_keeps_everything_with_weight_one():
    adv, groups = _batch()
    keep, weight = pruning.build("none")(adv, groups, torch.Generator().manual_seed(0))
    assert keep.tolist() == list(range(24)) and keep.dtype == torch.long
    assert weight.dtype == torch.float32 and bool((weight == 1).all())


@pytest.mark.parametrize("level", pruning.LEVELS)
def test_deterministic_per_generator(level):
    adv, groups = _batch()
    pruner = pruning.build("dppo", level=level)
    a = pruner(adv, groups, torch.Generator().manual_seed(5))
    b = pruner(adv, groups, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    draws = {tuple(pruner(adv, groups, torch.Generator().manual_seed(s))[0].tolist())
             for s in range(20)}
    assert len(draws) > 1  # it does prune at random


def test_zero_advantage_samples_dropped_only_with_drop_zero():
    adv, groups = _batch()
    zero = adv == 0
    assert int(zero.sum()) == 6  # the constant group and two samples of group 2
    for seed in range(50):
        keep, _ = pruning.build("dppo")(adv, groups, torch.Generator().manual_seed(seed))
        assert not zero[keep].any()
    p = pruning.build("dppo", drop_zero=False).keep_probabilities(adv, groups)
    assert bool((p > 0).all()) and bool((p[zero] <= 0.5).all())  # low samples, kept sometimes
    torch.testing.assert_close(p[groups == 17], torch.full((4,), 0.25))  # low group, low sample


def test_rules_of_the_three_levels():
    adv, groups = _batch()
    score = adv.abs()
    high = score >= torch.stack([score[groups == g].mean() for g in groups])
    p = pruning.build("dppo", level="sample", sample_rate=0.3).keep_probabilities(adv, groups)
    nonzero = adv != 0
    torch.testing.assert_close(p[high & nonzero], torch.ones(int((high & nonzero).sum())))
    torch.testing.assert_close(p[~high & nonzero], torch.full((int((~high & nonzero).sum()),), 0.7))
    assert bool((p[~nonzero] == 0).all())
    # group level: a kept group keeps all its non-zero samples, under one weight
    pruner = pruning.build("dppo", level="group", group_rate=0.6)
    for seed in range(20):
        keep, weight = pruner(adv, groups, torch.Generator().manual_seed(seed))
        for g in groups[keep].unique():
            members = ((groups == g) & nonzero).nonzero().flatten()
            assert set(members.tolist()) <= set(keep.tolist())
            assert len(weight[groups[keep] == g].unique()) == 1
    # rates 0: nothing but the zero-advantage samples is dropped
    keep, weight = pruning.build("dppo", group_rate=0, sample_rate=0)(
        adv, groups, torch.Generator().manual_seed(0))
    assert keep.tolist() == nonzero.nonzero().flatten().tolist() and bool((weight == 1).all())


@pytest.mark.parametrize("level", pruning.LEVELS)
@pytest.mark.parametrize("extra", [(), (3,)])
@pytest.mark.parametrize("drop_zero", [True, False])
def test_monte_carlo_unbiased(level, extra, drop_zero):
    """mean over seeds of sum_keep w_i g_i == sum_i g_i (over non-zero advantages when
    drop_zero) within 4 standard errors, per coordinate of random g_i."""
    adv, groups = _batch(extra)
    gen = torch.Generator().manual_seed(123)
    g = torch.randn(24, 5, generator=gen)
    nonzero = adv.reshape(24, -1).ne(0).any(1)
    target = (g[nonzero] if drop_zero else g).sum(0)
    pruner = pruning.build("dppo", group_rate=0.6, sample_rate=0.7, level=level,
                           drop_zero=drop_zero)
    p = pruner.keep_probabilities(adv, groups)
    # exact: sum_i p_i * (1 / p_i) * g_i over the samples that can be kept
    torch.testing.assert_close((p[p > 0, None] / p[p > 0, None] * g[p > 0]).sum(0), target)
    n = 3000
    totals = torch.empty(n, 5)
    kept = 0
    for seed in range(n):
        keep, weight = pruner(adv, groups, torch.Generator().manual_seed(seed))
        totals[seed] = (weight[:, None] * g[keep]).sum(0)
        kept += len(keep)
    mean, se = totals.mean(0), totals.std(0) / n ** 0.5
    assert bool(((mean - target).abs() <= 4 * se + 1e-5).all()), (mean, target, se)
    assert kept / n < 24 * 0.9  # it saves forwards


def test_weights_are_inverse_keep_probabilities():
    adv, groups = _batch()
    pruner = pruning.build("dppo", group_rate=0.5, sample_rate=0.25)
    p = pruner.keep_probabilities(adv, groups)
    keep, weight = pruner(adv, groups, torch.Generator().manual_seed(3))
    torch.testing.assert_close(weight, 1 / p[keep])
    assert bool((keep.diff() > 0).all())


def test_input_errors():
    pruner = pruning.build("dppo")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="groups must have shape"):
        pruner(torch.zeros(4), torch.zeros(3, dtype=torch.long), gen)
    with pytest.raises(ValueError, match="integer"):
        pruner(torch.zeros(4), torch.zeros(4), gen)
    with pytest.raises(ValueError, match="NaN"):
        pruner(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long), gen)


def test_saved_fraction():
    assert pruning.saved_fraction(torch.arange(6), 24) == pytest.approx(0.75)
    assert pruning.saved_fraction(24, 24) == 0.0
    with pytest.raises(ValueError):
        pruning.saved_fraction(3, 0)
    with pytest.raises(ValueError):
        pruning.saved_fraction(5, 4)


@pytest.mark.parametrize("name", ["none", "dppo"])
def test_an_empty_batch_keeps_nothing(name):
    keep, weight = pruning.build(name)(torch.zeros(0, 1, 3, 1), torch.zeros(0, dtype=torch.long),
                               torch.Generator().manual_seed(0))
    assert keep.numel() == 0 and weight.numel() == 0
