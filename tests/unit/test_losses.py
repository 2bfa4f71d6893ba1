"""Policy losses: the shared contract over every registered loss, then each formula by hand."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.registry import UnknownNameError
from flowgrpo.rl import losses
from flowgrpo.rl.losses import LOSSES
from helpers.losses import run_loss

METRIC_KEYS = {
    "train/clipfrac",
    "train/approx_kl",
    "train/ratio_mean",
    "train/ratio_min",
    "train/ratio_max",
}
ALL = LOSSES.names()


def test_registry_holds_the_losses():
    assert ALL == ["clip", "gate", "guard", "mhpo", "mu_grpo", "sapo", "stable", "unclipped"]
    with pytest.raises(UnknownNameError,
                       match="clip, gate, guard, mhpo, mu_grpo, sapo, stable, unclipped"):
        losses.get("ppo")


@pytest.mark.parametrize("name", ALL)
def test_ratio_one_is_grpo_gradient_and_nothing_clipped(name):
    adv = [1.5, -0.5, 0.0, -2.0, 1.0]
    _, grad, metrics = run_loss(name, [0.0] * 5, adv)
    torch.testing.assert_close(grad, -torch.tensor(adv) / 5)
    assert set(metrics) >= METRIC_KEYS
    for value in metrics.values():
        assert value.ndim == 0 and value.dtype == torch.float32 and not value.requires_grad
    assert metrics["train/clipfrac"] == 0
    assert metrics["train/approx_kl"] == 0
    assert metrics["train/ratio_mean"] == metrics["train/ratio_min"] == metrics["train/ratio_max"]
    assert metrics["train/ratio_mean"] == 1


@pytest.mark.parametrize("name", ALL)
def test_one_step_moves_logp_with_the_advantage_sign(name):
    # Inside every default trust region (|log r| << 1e-4), not exactly at ratio 1.
    log_ratio = [3e-5, -2e-5, 1e-5, -3e-5]
    adv = [1.0, 1.0, -1.0, -1.0]
    _, grad, _ = run_loss(name, log_ratio, adv)
    step = -0.1 * grad  # one gradient-descent step on logp
    assert (step[:2] > 0).all(), "positive advantage must raise the log-prob"
    assert (step[2:] < 0).all(), "negative advantage must lower the log-prob"


@pytest.mark.parametrize("name", ALL)
def test_zero_advantage_gives_zero_gradient(name):
    _, grad, _ = run_loss(name, [0.3, -0.2, 1e-5, 0.0], [0.0] * 4)
    assert torch.equal(grad, torch.zeros(4))


@pytest.mark.parametrize("name", ["clip", "stable"])
def test_clip_cuts_the_gradient_outside_the_trust_region(name):
    # Ratio e^0.5 far above 1 + clip_high with A > 0: no incentive to go further.
    _, grad, metrics = run_loss(name, [0.5, 0.0], [1.0, 1.0], clip_low=0.2, clip_high=0.2)
    assert grad[0] == 0
    assert grad[1] < 0
    assert metrics["train/clipfrac"] == pytest.approx(0.5)


def test_stable_clips_unconditionally_unlike_clip():
    # A < 0 with a huge (noisy) ratio: PPO's max keeps the unclipped term and its large gradient;
    # StableDRL cuts it whatever the advantage's sign.
    _, grad_clip, _ = run_loss("clip", [3.0, 0.0], [-1.0, 1.0], clip_low=0.2, clip_high=0.2)
    _, grad_stable, _ = run_loss("stable", [3.0, 0.0], [-1.0, 1.0], clip_low=0.2, clip_high=0.2)
    assert grad_clip[0] == pytest.approx(math.exp(3.0) / 2)
    assert grad_stable[0] == 0


# Shared small example: ratios [1.5, 0.5, 1.05, 0.98, 0.5], trust region [0.9, 1.2].
RATIOS = [1.5, 0.5, 1.05, 0.98, 0.5]
ADV = [1.0, -1.0, -2.0, 0.5, 1.0]
BOUNDS = {"clip_low": 0.1, "clip_high": 0.2}


def test_clip_matches_hand_computation():
    loss, grad, m = run_loss("clip", [math.log(r) for r in RATIOS], ADV, **BOUNDS)
    # max(-A r, -A clip(r)) per sample: [-1.2 (cut), 0.9 (cut), 2.1, -0.49, -0.5 (A > 0, r low:
    # the unclipped term is the pessimistic one, the gradient flows)].
    assert loss.item() == pytest.approx((-1.2 + 0.9 + 2.1 - 0.49 - 0.5) / 5, rel=1e-5)
    # d loss / d logp_i = -A_i r_i / B where not cut.
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 2.1 / 5, -0.49 / 5, -0.5 / 5]))
    assert m["train/clipfrac"].item() == pytest.approx(0.4)
    assert m["train/ratio_mean"].item() == pytest.approx(4.53 / 5, rel=1e-5)
    assert m["train/ratio_min"].item() == pytest.approx(0.5, rel=1e-5)
    assert m["train/ratio_max"].item() == pytest.approx(1.5, rel=1e-5)
    kl = 0.5 * sum(math.log(r) ** 2 for r in RATIOS) / 5
    assert m["train/approx_kl"].item() == pytest.approx(kl, rel=1e-5)


def test_stable_matches_hand_computation():
    loss, grad, m = run_loss("stable", [math.log(r) for r in RATIOS], ADV, **BOUNDS)
    rho = [1.2, 0.9, 1.05, 0.98, 0.9]  # clamped to [0.9, 1.2] whatever the advantage's sign
    total = sum(rho)  # 5.03, the self-normalizer
    weighted = 1.2 * 1 + 0.9 * -1 + 1.05 * -2 + 0.98 * 0.5 + 0.9 * 1
    assert loss.item() == pytest.approx(-weighted / total, rel=1e-5)
    # Gradient only inside the range: -A_i r_i / sum(rho).
    expected = torch.tensor([0.0, 0.0, 2.1 / total, -0.49 / total, 0.0])
    torch.testing.assert_close(grad, expected)
    assert m["train/clipfrac"].item() == pytest.approx(0.6)


def test_sapo_matches_hand_computation():
    ratios, adv = [2.0, 0.5, 1.05, 0.98], [1.0, -1.0, -2.0, 0.5]
    tau_pos, tau_neg = 2.0, 3.0
    loss, grad, m = run_loss(
        "sapo", [math.log(r) for r in ratios], adv, tau_pos=tau_pos, tau_neg=tau_neg
    )
    taus = [tau_pos if a > 0 else tau_neg for a in adv]
    gates = [1 / (1 + math.exp(-t * (r - 1))) for t, r in zip(taus, ratios)]
    expected = -sum(g * 4 / t * a for g, t, a in zip(gates, taus, adv)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # d/dlogp of f(r) = f'(r) * r with f'(r) = 4 s (1 - s).
    expected_grad = [-a * 4 * g * (1 - g) * r / 4 for a, g, r in zip(adv, gates, ratios)]
    torch.testing.assert_close(grad, torch.tensor(expected_grad))
    # Slopes: 0.42 (gated: tau |r - 1| = 2 > 1.76), 0.60, 0.98, 1.0.
    assert m["train/clipfrac"].item() == pytest.approx(0.25)


def test_sapo_gate_slope_is_one_at_ratio_one_for_any_temperature():
    for tau in (0.5, 1.0, 1.05, 1.76e4):
        _, grad, _ = run_loss("sapo", [0.0, 0.0], [1.0, -1.0], tau_pos=tau, tau_neg=tau)
        torch.testing.assert_close(grad, torch.tensor([-0.5, 0.5]))


def test_guard_matches_hand_computation():
    # Log-ratios with batch mean 0.1; centred: [0.2, 0, -0.2, 0].
    loss, grad, m = run_loss(
        "guard", [0.3, 0.1, -0.1, 0.1], [1.0, -1.0, -1.0, 2.0], clip_low=0.1, clip_high=0.1
    )
    # r~ = [e^0.2 = 1.22 (A > 0, cut: -1.1), 1 (1.0), e^-0.2 = 0.82 (A < 0, cut: 0.9), 1 (-2.0)].
    assert loss.item() == pytest.approx((-1.1 + 1.0 + 0.9 - 2.0) / 4, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.25, 0.0, -0.5]))
    assert m["train/clipfrac"].item() == pytest.approx(0.5)
    assert m["train/ratio_max"].item() == pytest.approx(math.exp(0.3), rel=1e-5)  # raw ratio


def test_guard_clips_the_positive_sample_a_left_shift_hides_from_clip():
    # Every ratio drifted below 1 (GRPO-Guard's observation); the positive sample sits at raw
    # ratio 1, inside clip's region, yet 0.15 above the batch's centre.
    log_ratio, adv = [-0.2, -0.2, -0.2, 0.0], [-1.0, -1.0, -1.0, 3.0]
    _, grad_clip, m_clip = run_loss("clip", log_ratio, adv, clip_low=0.1, clip_high=0.1)
    _, grad_guard, m_guard = run_loss("guard", log_ratio, adv, clip_low=0.1, clip_high=0.1)
    assert grad_clip[3] < 0 and m_clip["train/clipfrac"] == 0.75  # negatives cut, positive not
    assert grad_guard[3] == 0 and m_guard["train/clipfrac"] == 0.25
    torch.testing.assert_close(grad_guard[:3], torch.full((3,), 0.25 * math.exp(-0.05)))


def test_guard_scale_multiplies_the_centred_log_ratio():
    adv = [1.0, -1.0]
    _, grad, _ = run_loss("guard", [0.0, 0.0], adv, scale=2.0)
    torch.testing.assert_close(grad, torch.tensor([-1.0, 1.0]))
    _, grad, _ = run_loss("guard", [0.0, 0.0], adv, scale=torch.tensor([0.5, 3.0]))
    torch.testing.assert_close(grad, torch.tensor([-0.25, 1.5]))


@pytest.mark.parametrize("name", ALL)
def test_inputs_are_cast_to_float32(name):
    logp = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    logp_old = torch.tensor([-1.0, -2.0], dtype=torch.bfloat16)
    loss, _ = losses.get(name)(logp, logp_old, torch.tensor([1.0, -1.0], dtype=torch.float16))
    assert loss.dtype == torch.float32
    loss.backward()
    assert logp.grad.dtype == torch.float64


def test_bad_params_and_shapes_fail_clearly():
    logp, adv = torch.zeros(3), torch.ones(3)
    with pytest.raises(ValueError, match="clip_low"):
        losses.get("clip")(logp, logp, adv, clip_low=1.5)
    with pytest.raises(ValueError, match="tau"):
        losses.get("sapo")(logp, logp, adv, tau_neg=0.0)
    with pytest.raises(TypeError, match="clip_hgih"):
        losses.get("stable")(logp, logp, adv, clip_hgih=0.1)
    with pytest.raises(ValueError, match="adv must have"):
        losses.get("guard")(logp, logp, torch.ones(2))


