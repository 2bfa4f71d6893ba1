"""The focal, a_grae, dual_anchor and rcc estimators, and the params/state/progress interface,
against hand computations on small groups (population std, ddof = 0)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from flowgrpo.rl import advantages
from flowgrpo.rl.advantages import ADVANTAGES, check_params, compute_advantages, estimator_params
from flowgrpo.rl.advantages.variants import success_rate

EPS = 1e-4
NEW = ("focal", "a_grae", "dual_anchor", "rcc")

# Binary rewards, groups of 4: all successes, all failures, a single success, three successes.
BINARY = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0])
GROUPS4 = torch.arange(16) // 4
S1 = math.sqrt(0.25 * 0.75)  # population std of a group with one success (or one failure) in 4
# GRPO advantages of BINARY: groups 0 and 1 are constant.
Z = torch.tensor([0.0] * 8 + [0.75 / (S1 + EPS)] + [-0.25 / (S1 + EPS)] * 3
                 + [0.25 / (S1 + EPS)] * 3 + [-0.75 / (S1 + EPS)])


def one_line(excinfo: pytest.ExceptionInfo) -> bool:
    return "\n" not in str(excinfo.value)


def test_registry_and_params():
    assert set(NEW) <= set(ADVANTAGES.names())
    assert estimator_params("focal") == ["gamma", "reward_range"]
    assert estimator_params("a_grae") == ["schedule", "alpha", "reward_range"]
    assert estimator_params("dual_anchor") == ["alpha", "decay"]
    assert estimator_params("rcc") == ["coef"]
    assert estimator_params("group") == []
    check_params("focal", {"gamma": 2.0})
    check_params("group", None)


def test_success_rate_binary_and_continuous():
    mean = torch.tensor([0.3, 0.3, 0.8, 0.8])
    rewards = torch.tensor([0.2, 0.4, 0.6, 1.0])
    torch.testing.assert_close(success_rate(rewards, mean), torch.tensor([0.125] * 2 + [0.75] * 2))
    torch.testing.assert_close(success_rate(rewards, mean, [0, 2]),
                               torch.tensor([0.15] * 2 + [0.4] * 2))
    # binary: the fraction of successes
    groups_mean = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.25] * 4 + [0.75] * 4)
    assert torch.equal(success_rate(BINARY, groups_mean), groups_mean)
    # a column constant over the batch
    assert torch.equal(success_rate(torch.ones(3), torch.ones(3)), torch.zeros(3))


# ---------------------------------------------------------------------------------------- focal
def test_focal_binary_groups():
    adv = advantages.get("focal")(BINARY, GROUPS4)  # gamma = 1
    weight = torch.tensor([0.0] * 8 + [0.75] * 4 + [0.25] * 4)  # 1 - p_g
    assert torch.equal(adv[:8], torch.zeros(8))  # all equal: all successes, all failures
    torch.testing.assert_close(adv, Z * weight)
    # gamma = 0 is plain GRPO, bit for bit
    assert torch.equal(advantages.get("focal")(BINARY, GROUPS4, gamma=0.0),
                       advantages.get("group")(BINARY, GROUPS4))


def test_focal_continuous_rewards():
    rewards = torch.tensor([0.2, 0.4, 0.6, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    z = torch.tensor([-0.1 / (0.1 + EPS), 0.1 / (0.1 + EPS), -0.2 / (0.2 + EPS), 0.2 / (0.2 + EPS)])
    # batch range [0.2, 1.0]: p = 0.125 and 0.75
    weight = torch.tensor([0.875**2] * 2 + [0.25**2] * 2)
    torch.testing.assert_close(advantages.get("focal")(rewards, groups, gamma=2.0), z * weight)
    # a fixed range [0, 1]: p = 0.3 and 0.8
    weight = torch.tensor([0.7] * 2 + [0.2] * 2)
    torch.testing.assert_close(advantages.get("focal")(rewards, groups, reward_range=(0, 1)),
                               z * weight)


# --------------------------------------------------------------------------------------- a_grae
def a_grae_weights(rate: float, c: float) -> float:
    root = math.sqrt(rate)
    return (1 - c) * 0.5 / (1 - root + EPS) + c * 0.5 / (root + EPS)


@pytest.mark.parametrize("progress", [0.0, 0.3, 1.0])
def test_a_grae_binary_groups(progress):
    adv = advantages.get("a_grae")(BINARY, GROUPS4, progress=progress)
    assert torch.equal(adv[:8], torch.zeros(8))  # all equal groups stay 0
    batch_rate = 0.5  # mean of the group success rates 1, 0, 0.25, 0.75
    expected = Z.clone()
    expected[8:12] *= a_grae_weights(0.25, progress)
    expected[12:] *= a_grae_weights(0.75, progress)
    expected = torch.where(expected > 0, expected * batch_rate, expected)  # alpha = 1
    torch.testing.assert_close(adv, expected)
    assert adv[8] > 0 > adv[9]  # the single success still leads its group


def test_a_grae_curriculum_moves_from_easy_to_hard_with_progress():
    groups = torch.arange(16) // 8
    rewards = torch.zeros(16)
    rewards[0] = 1.0  # hard prompt: 1 success in 8
    rewards[8:15] = 1.0  # easy prompt: 7 successes in 8
    ratios = []
    for progress in (0.0, 0.25, 0.5, 0.75, 1.0):
        adv = advantages.get("a_grae")(rewards, groups, progress=progress)
        hard, easy = adv[:8].abs().sum(), adv[8:].abs().sum()
        ratios.append(float(hard / easy))
    assert ratios == sorted(ratios) and len(set(ratios)) == len(ratios)
    assert ratios[0] < 1 < ratios[-1]  # easy prompts first, hard ones last
    # schedule="accuracy" (the reference code) follows the batch success rate, not progress
    fixed = [advantages.get("a_grae")(rewards, groups, progress=p, schedule="accuracy")
             for p in (0.0, 1.0)]
    assert torch.equal(*fixed)
    torch.testing.assert_close(fixed[0], advantages.get("a_grae")(rewards, groups, progress=0.5))


def test_a_grae_attenuates_positive_advantages_only():
    rewards = torch.tensor([0.2, 0.4, 0.6, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    base = advantages.get("a_grae")(rewards, groups, progress=0.5, alpha=1e-3)  # no attenuation
    half = advantages.get("a_grae")(rewards, groups, progress=0.5, alpha=2.0)
    rate = (0.125 + 0.125 + 0.75 + 0.75) / 4  # batch mean success rate (continuous rewards)
    torch.testing.assert_close(half, torch.where(base > 0, base * rate / 2.0, base))
    assert (half[base < 0] == base[base < 0]).all()


# ---------------------------------------------------------------------------------- dual_anchor
def test_dual_anchor_without_history_is_group():
    group = advantages.get("group")(BINARY, GROUPS4)
    assert torch.equal(advantages.get("dual_anchor")(BINARY, GROUPS4), group)
    state: dict = {}
    assert torch.equal(advantages.get("dual_anchor")(BINARY, GROUPS4, state=state), group)
    assert state == {"baseline": 0.5, "scale": 0.5, "count": 1}


def test_dual_anchor_running_baseline_gives_constant_groups_a_signal():
    estimate = advantages.get("dual_anchor")
    groups = torch.tensor([0, 0, 1, 1])
    state: dict = {}
    estimate(torch.tensor([0.0, 1.0, 0.0, 1.0]), groups, state=state)  # baseline 0.5, scale 0.5
    adv = estimate(torch.tensor([1.0, 1.0, 0.0, 1.0]), groups, state=state)
    # group 0 is constant (all 1): only the global anchor speaks, 0.5 * (1 - 0.5) / 0.5
    expected = torch.tensor([0.25, 0.25, -0.75, 0.75]) / (0.5 + EPS)
    torch.testing.assert_close(adv, expected)
    assert adv[0] > 0
    batch_std = math.sqrt(0.75 / 4)
    assert state["count"] == 2
    assert state["baseline"] == pytest.approx(0.9 * 0.5 + 0.1 * 0.75)
    assert state["scale"] == pytest.approx(0.9 * 0.5 + 0.1 * batch_std)
    assert json.loads(json.dumps(state)) == state  # checkpointable
    # a constant group below the running baseline is pushed down
    adv = estimate(torch.tensor([0.0, 0.0, 0.0, 1.0]), groups, state=state)
    assert adv[0] < 0 and adv[0] == adv[1]


def test_dual_anchor_through_compute_advantages():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    state = {"baseline": 0.5, "scale": 0.5, "count": 3}
    adv, metrics = compute_advantages(rewards, groups, estimator="dual_anchor", adv_clip=None,
                                      params={"alpha": 0.5}, state=state)
    torch.testing.assert_close(adv, torch.tensor([0.25, 0.25, -0.75, 0.75]) / (0.5 + EPS))
    assert metrics["rollout/zero_std_frac"] == pytest.approx(0.5)  # bookkeeping unchanged
    assert state["count"] == 4
    # normalize_then_sum keeps one state per named reward
    state = {}
    named = {"a": rewards, "b": torch.tensor([0.0, 2.0, 1.0, 1.0])}
    compute_advantages(named, groups, estimator="dual_anchor", state=state,
                       aggregation="normalize_then_sum")
    assert set(state) == {"a", "b"}
    assert state["a"]["baseline"] == pytest.approx(0.75)
    assert state["b"]["baseline"] == pytest.approx(1.0) and state["b"]["count"] == 1
    # a stateless estimator ignores the state
    compute_advantages(rewards, groups, estimator="group", state=state, progress=0.5)
    assert set(state) == {"a", "b"}


# ------------------------------------------------------------------------------------------ rcc
def test_rcc_hand_computation():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    confidence = torch.tensor([2.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0])
    estimate = advantages.get("rcc")
    assert torch.equal(estimate(rewards, groups), advantages.get("group")(rewards, groups))
    # group 0: Cov(r, c) = (0.75 * 1.5 + 3 * 0.25 * 0.5) / 4 = 0.375, so b = 0.25 + 2 * 0.375 = 1
    adv = estimate(rewards, groups, confidence=confidence)
    expected = torch.tensor([0.0, -1.0, -1.0, -1.0]) / (S1 + EPS)
    torch.testing.assert_close(adv[:4], expected)
    assert torch.equal(adv[4:], torch.zeros(4))  # a constant group stays 0
    # coef scales the correction; uncorrelated confidence changes nothing
    half = estimate(rewards, groups, confidence=confidence, coef=1.0)
    torch.testing.assert_close(half[:4], torch.tensor([0.375, -0.625, -0.625, -0.625]) / (S1 + EPS))
    flat = estimate(rewards, groups, confidence=torch.ones(8))
    torch.testing.assert_close(flat, advantages.get("group")(rewards, groups))
    via, _ = compute_advantages(rewards, groups, estimator="rcc", adv_clip=None,
                                confidence=confidence)
    torch.testing.assert_close(via, adv)


# ----------------------------------------------------------------------------------- per column
@pytest.mark.parametrize("name", NEW)
def test_every_column_is_its_own_problem(name):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, 3, generator=gen)
    rewards[:4, 1] = 0.5  # one group constant in column 1 only
    groups = torch.tensor([2, 2, 2, 2, 7, 7, 7, 7, 4, 4, 4, 4])
    confidence = torch.randn(12, 3, generator=gen)
    extra = {"a_grae": {"progress": 0.4}, "rcc": {"confidence": confidence}}.get(name, {})
    estimate = advantages.get(name)
    state: dict = {}
    column_states: list[dict] = [{} for _ in range(3)]
    if name == "dual_anchor":  # build a history first, then compare with per-column states
        history = torch.rand(12, 3, generator=gen)
        estimate(history, groups, state=state)
        for j in range(3):
            estimate(history[:, j], groups, state=column_states[j])
        assert state["baseline"] == pytest.approx([s["baseline"] for s in column_states])
    whole = estimate(rewards, groups, **extra, **({"state": state} if state else {}))
    assert whole.shape == rewards.shape
    for j in range(3):
        kw = {key: value[:, j] if isinstance(value, torch.Tensor) else value
              for key, value in extra.items()}
        if name == "dual_anchor":
            kw["state"] = column_states[j]
        torch.testing.assert_close(whole[:, j], estimate(rewards[:, j], groups, **kw))
    if name != "dual_anchor":
        assert torch.equal(whole[:4, 1], torch.zeros(4))
    else:
        assert whole[0, 1] == whole[1, 1] != 0


def test_rcc_broadcasts_a_per_sample_confidence_over_columns():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    groups = torch.tensor([0, 0, 0, 0])
    confidence = torch.tensor([1.0, -1.0, 0.5, 0.0])
    adv = advantages.get("rcc")(rewards, groups, confidence=confidence)
    expanded = advantages.get("rcc")(rewards, groups, confidence=confidence[:, None].expand(4, 2))
    assert torch.equal(adv, expanded)


# ------------------------------------------------------------------------------- the interface
def test_compute_advantages_passes_params_and_progress():
    direct = advantages.get("a_grae")(BINARY, GROUPS4, progress=0.8, alpha=0.5)
    via, _ = compute_advantages(BINARY, GROUPS4, estimator="a_grae", adv_clip=None,
                                params={"alpha": 0.5}, progress=0.8)
    torch.testing.assert_close(via, direct)
    via, _ = compute_advantages(BINARY, GROUPS4, estimator="focal", adv_clip=None,
                                params={"gamma": 2.0}, progress=0.8, confidence=torch.ones(16))
    torch.testing.assert_close(via, advantages.get("focal")(BINARY, GROUPS4, gamma=2.0))


@pytest.mark.parametrize("call, error, match", [
    (lambda: advantages.get("focal")(BINARY, GROUPS4, gamma=-1.0), ValueError, "gamma"),
    (lambda: advantages.get("focal")(BINARY, GROUPS4, gamma="2"), TypeError, "gamma"),
    (lambda: advantages.get("focal")(BINARY, GROUPS4, reward_range=(1, 0)), ValueError, "low"),
    (lambda: advantages.get("focal")(BINARY, GROUPS4, reward_range=5), TypeError, "reward_range"),
    (lambda: advantages.get("focal")(BINARY, GROUPS4, reward_range=(0, 0.5)), ValueError,
     "outside"),
    (lambda: advantages.get("a_grae")(BINARY, GROUPS4, progress=1.5), ValueError, "progress"),
    (lambda: advantages.get("a_grae")(BINARY, GROUPS4, schedule="linear"), ValueError,
     "progress, accuracy"),
    (lambda: advantages.get("a_grae")(BINARY, GROUPS4, alpha=0), ValueError, "alpha"),
    (lambda: advantages.get("dual_anchor")(BINARY, GROUPS4, decay=1.0), ValueError, "decay"),
    (lambda: advantages.get("dual_anchor")(BINARY, GROUPS4, state=[]), TypeError, "state"),
    (lambda: advantages.get("dual_anchor")(BINARY, GROUPS4,
                                           state={"baseline": [0.0, 1.0], "scale": [1.0, 1.0],
                                                  "count": 1}), ValueError, "shape"),
    (lambda: advantages.get("rcc")(BINARY, GROUPS4, confidence=torch.ones(3)), ValueError,
     "confidence"),
    (lambda: advantages.get("rcc")(BINARY, GROUPS4, coef=None), TypeError, "coef"),
    (lambda: compute_advantages(BINARY, GROUPS4, estimator="focal", params={"gama": 1}),
     TypeError, "did you mean gamma"),
    (lambda: compute_advantages(BINARY, GROUPS4, estimator="dual_anchor", params={"state": {}}),
     TypeError, "supplied by the trainer"),
    (lambda: compute_advantages(BINARY, GROUPS4, estimator="group", params={"gamma": 1}),
     TypeError, "valid: none"),
    (lambda: compute_advantages(BINARY, GROUPS4, params=[1]), TypeError, "dict"),
    (lambda: compute_advantages(BINARY, GROUPS4, progress=-0.1), ValueError, "progress"),
    (lambda: compute_advantages(BINARY, GROUPS4, estimator="dual_anchor", state=3), TypeError,
     "state"),
])
def test_parameter_errors_are_one_line(call, error, match):
    with pytest.raises(error, match=match) as excinfo:
        call()
    assert one_line(excinfo)
