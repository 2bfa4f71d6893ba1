"""The ``gate``, ``mhpo`` and ``mu_grpo`` policy losses: the shared contract, each formula by
hand, the admissible-gate properties for every gate, and parameter errors."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.rl import losses
from flowgrpo.rl.losses import LOSSES
from flowgrpo.rl.losses import variants as loss_variants
from helpers.losses import run_loss

NEW = ["gate", "mhpo", "mu_grpo"]
GATES = ["sigmoid", "tanh", "arctan", "erf", "softsign"]
SUP_G = {"sigmoid": 2.0, "tanh": 1.0, "arctan": math.pi / 2, "erf": math.sqrt(math.pi / 2),
         "softsign": 1.0}


def _g(fn: str, z: float) -> float:
    return {"sigmoid": 4.0 * (1.0 / (1.0 + math.exp(-z)) - 0.5), "tanh": math.tanh(z),
            "arctan": math.atan(z), "erf": math.sqrt(math.pi / 2) * math.erf(z / math.sqrt(2)),
            "softsign": z / math.sqrt(1.0 + z * z)}[fn]


def _dg(fn: str, z: float) -> float:
    return {"sigmoid": 1.0 / math.cosh(z / 2) ** 2, "tanh": 1.0 / math.cosh(z) ** 2,
            "arctan": 1.0 / (1.0 + z * z), "erf": math.exp(-z * z / 2),
            "softsign": (1.0 + z * z) ** -1.5}[fn]


# ---------------------------------------------------------------------------------------------
# Shared contract


def test_new_losses_are_registered():
    for name in NEW:
        assert name in LOSSES
        assert losses.get(name) is getattr(loss_variants, f"{name}_loss")


@pytest.mark.parametrize(
    ("name", "params"),
    [("gate", {"fn": fn}) for fn in GATES]
    + [("gate", {"fn": fn, "tau_pos": 1.0, "tau_neg": 1.05}) for fn in GATES]
    + [("mhpo", {}), ("mhpo", {"scale": 1.0}), ("mhpo", {"scale": 1.0, "c": 0.5, "k_neg": 3.0}),
       ("mu_grpo", {}), ("mu_grpo", {"veto": None, "clip_low": 0.2, "clip_high": 0.28})],
)
def test_ratio_one_is_grpo_gradient_with_the_shared_metrics(name, params):
    adv = [1.5, -0.5, 0.0, -2.0, 1.0]
    loss, grad, metrics = run_loss(name, [0.0] * 5, adv, **params)
    torch.testing.assert_close(grad, -torch.tensor(adv) / 5)
    _, _, clip_metrics = run_loss("clip", [0.0] * 5, adv)
    assert set(metrics) == set(clip_metrics)
    for value in metrics.values():
        assert value.ndim == 0 and value.dtype == torch.float32 and not value.requires_grad
    assert metrics["train/clipfrac"] == 0
    assert metrics["train/ratio_mean"] == 1


@pytest.mark.parametrize("name", NEW)
def test_loss_at_ratio_one_is_grpo(name):
    # Every new loss is normalised so that the loss at ratio 1 is GRPO's -mean(A).
    loss, _, _ = run_loss(name, [0.0] * 3, [1.0, -3.0, 0.5])
    assert loss.item() == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize("name", NEW)
def test_metric_keys_match_every_other_loss(name):
    keys = {n: set(run_loss(n, [1e-5, -2e-5], [1.0, -1.0])[2]) for n in LOSSES.names()}
    assert all(k == keys["clip"] for k in keys.values())
    assert keys[name] == keys["clip"]


@pytest.mark.parametrize("name", NEW)
def test_bad_shapes_fail_in_one_line(name):
    fn = losses.get(name)
    cases = [
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), "logp must be"),
        (torch.zeros(0), torch.zeros(0), torch.zeros(0), "logp must be"),
        (torch.zeros(3), torch.zeros(2), torch.zeros(3), "logp_old must have"),
        (torch.zeros(3), torch.zeros(3), torch.zeros(3, 1), "adv must have"),
    ]
    for logp, logp_old, adv, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            fn(logp, logp_old, adv)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "params", "error", "match"),
    [
        ("gate", {"fn": "relu"}, ValueError, "arctan, erf, sigmoid, softsign, tanh"),
        ("gate", {"fn": None}, ValueError, "fn must be one of"),
        ("gate", {"tau_pos": 0.0}, ValueError, "tau_pos"),
        ("gate", {"tau_neg": -1.0}, ValueError, "tau_neg"),
        ("gate", {"temperature": 1.0}, TypeError, "temperature"),
        ("mhpo", {"scale": 0.0}, ValueError, "scale"),
        ("mhpo", {"c": -1.5}, ValueError, "c must be"),
        ("mhpo", {"k_pos": 0.0}, ValueError, "k_pos"),
        ("mhpo", {"lambda_neg": float("nan")}, ValueError, "lambda_neg"),
        ("mhpo", {"lamda_pos": 1.0}, TypeError, "lamda_pos"),
        ("mu_grpo", {"veto": 0.0}, ValueError, "veto"),
        ("mu_grpo", {"clip_low": 1.0}, ValueError, "clip_low"),
        ("mu_grpo", {"clip_high": -0.1}, ValueError, "clip_high"),
        ("mu_grpo", {"veto_threshold": 1e-4}, TypeError, "veto_threshold"),
    ],
)
def test_bad_params_fail_in_one_line(name, params, error, match):
    x = torch.zeros(3)
    with pytest.raises(error, match=match) as err:
        losses.get(name)(x, x, torch.ones(3), **params)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# gate


@pytest.mark.parametrize("fn", GATES)
def test_gate_matches_hand_computation(fn):
    ratios, adv = [1.3, 0.6, 1.05, 0.9, 2.5], [1.0, -1.0, -2.0, 0.5, 1.0]
    tau_pos, tau_neg = 2.0, 3.0
    loss, grad, m = run_loss("gate", [math.log(r) for r in ratios], adv, fn=fn, tau_pos=tau_pos,
                         tau_neg=tau_neg)
    taus = [tau_pos if a > 0 else tau_neg for a in adv]
    zs = [t * (r - 1) for t, r in zip(taus, ratios)]
    values = [1 + _g(fn, z) / t for z, t in zip(zs, taus)]
    assert loss.item() == pytest.approx(-sum(v * a for v, a in zip(values, adv)) / 5, rel=1e-5)
    slopes = [_dg(fn, z) for z in zs]
    expected = [-a * s * r / 5 for a, s, r in zip(adv, slopes, ratios)]
    torch.testing.assert_close(grad, torch.tensor(expected))
    assert m["train/clipfrac"].item() == pytest.approx(sum(s < 0.5 for s in slopes) / 5)


def test_gate_sigmoid_has_sapos_gradient_and_a_constant_loss_offset():
    log_ratio, adv = [0.4, -0.3, 0.05, -0.02], [1.0, -1.0, -2.0, 0.5]
    for tau_pos, tau_neg in ((1.0, 1.05), (2.0, 3.0), (2e4, 2.4e4)):
        params = {"tau_pos": tau_pos, "tau_neg": tau_neg}
        scaled = [x * 1e-4 if tau_pos > 1e3 else x for x in log_ratio]
        loss_g, grad_g, m_g = run_loss("gate", scaled, adv, fn="sigmoid", **params)
        loss_s, grad_s, m_s = run_loss("sapo", scaled, adv, **params)
        torch.testing.assert_close(grad_g, grad_s)
        taus = [tau_pos if a > 0 else tau_neg for a in adv]
        offset = sum((1 - 2 / t) * a for t, a in zip(taus, adv)) / 4
        assert loss_g.item() == pytest.approx(loss_s.item() - offset, abs=1e-5)
        assert m_g["train/clipfrac"] == m_s["train/clipfrac"]


def test_gate_tanh_is_sigmoid_at_twice_the_temperature():
    log_ratio, adv = [0.3, -0.2, 0.1, 1e-3], [1.0, -1.0, 0.5, -2.0]
    _, grad_tanh, _ = run_loss("gate", log_ratio, adv, fn="tanh", tau_pos=1.5, tau_neg=2.5)
    _, grad_sig, _ = run_loss("gate", log_ratio, adv, fn="sigmoid", tau_pos=3.0, tau_neg=5.0)
    torch.testing.assert_close(grad_tanh, grad_sig)


def _curve(fn: str, ratios: list[float], tau: float) -> tuple[list[float], list[float]]:
    """Gate value ``f(r)`` and slope ``f'(r)`` through the public loss: with ``B = 1`` and
    ``A = 1``, ``loss = -f(r)`` and ``d loss / d logp = -f'(r) r``."""
    values, slopes = [], []
    for r in ratios:
        loss, grad, _ = run_loss("gate", [math.log(r)], [1.0], fn=fn, tau_pos=tau)
        values.append(-loss.item())
        slopes.append(-grad.item() / r)
    return values, slopes


@pytest.mark.parametrize("fn", GATES)
@pytest.mark.parametrize("tau", [1.0, 10.0])
class TestAdmissibleGate:
    """Each property of an admissible gate (``gate_loss`` docstring), numerically, per gate."""

    def test_continuously_differentiable(self, fn, tau):
        # The autograd slope agrees with a central difference of the loss value everywhere,
        # across r = 1 and on both tails.
        h = 1e-3
        for d in (-0.5, -0.05, -1e-3, 0.0, 1e-3, 0.05, 0.3, 2.0):
            loss, grad, _ = run_loss("gate", [d], [1.0], fn=fn, tau_pos=tau)
            up, _, _ = run_loss("gate", [d + h], [1.0], fn=fn, tau_pos=tau)
            down, _, _ = run_loss("gate", [d - h], [1.0], fn=fn, tau_pos=tau)
            numeric = (up - down).item() / (2 * h)
            assert grad.item() == pytest.approx(numeric, abs=2e-3)

    def test_value_at_one_is_finite(self, fn, tau):
        values, _ = _curve(fn, [1.0], tau)
        assert values == [1.0]

    def test_slope_at_one_is_the_maximum_one(self, fn, tau):
        ratios = [1.0 + d for d in torch.linspace(-0.99, 3.0, 400).tolist()]
        _, slopes = _curve(fn, [1.0] + ratios, tau)
        assert slopes[0] == pytest.approx(1.0, abs=1e-6)
        assert max(slopes) <= slopes[0] + 1e-6

    def test_slope_is_positive(self, fn, tau):
        # Strictly positive in exact arithmetic; float32 rounds the tanh gate's slope to 0 beyond
        # |tau (r - 1)| ~ 9 (tanh rounds to 1) and the erf gate's beyond ~13, so stop at 8.
        zs = torch.linspace(-min(tau, 8.0) * 0.99, 8.0, 200).tolist()
        ratios = [1.0 + z / tau for z in zs]
        _, slopes = _curve(fn, ratios, tau)
        assert min(slopes) > 0

    def test_slope_is_even_around_one_and_unimodal(self, fn, tau):
        deltas = torch.linspace(0.0, 0.95, 60).tolist()
        _, right = _curve(fn, [1.0 + d for d in deltas], tau)
        _, left = _curve(fn, [1.0 - d for d in deltas], tau)
        torch.testing.assert_close(torch.tensor(left), torch.tensor(right), rtol=1e-3, atol=1e-6)
        _, far = _curve(fn, [1.0 + d for d in torch.linspace(0.0, 20.0, 200).tolist()], tau)
        assert all(b <= a + 1e-6 for a, b in zip(right, right[1:]))
        assert all(b <= a + 1e-6 for a, b in zip(far, far[1:]))

    def test_gate_is_bounded(self, fn, tau):
        ratios = [1e-6, 1e-2, 0.5, 1.0, 2.0, 1e2, 1e4, 1e6]
        values, _ = _curve(fn, ratios, tau)
        bound = SUP_G[fn] / tau
        assert all(abs(v - 1.0) <= bound + 1e-5 for v in values)
        assert values == sorted(values)  # increasing
        assert values[-1] == pytest.approx(1.0 + bound, abs=1e-3)

    def test_slope_and_gradient_vanish_as_the_ratio_grows(self, fn, tau):
        ratios = [1e2, 1e4, 1e6]
        _, slopes = _curve(fn, ratios, tau)
        gradients = [s * r for s, r in zip(slopes, ratios)]
        assert all(b <= a for a, b in zip(slopes, slopes[1:]))
        assert all(b <= a for a, b in zip(gradients, gradients[1:]))
        assert slopes[-1] < 1e-6 and gradients[-1] < 1e-3


@pytest.mark.parametrize("fn", GATES)
def test_gate_defaults_act_at_the_flow_grpo_trust_region(fn):
    # Inside (2e-5) the update is nearly undamped; at Flow-GRPO's bound (1e-4) every gate has cut
    # it by more than half, on both sides and for both advantage signs.
    _, grad, m = run_loss("gate", [2e-5, -2e-5, 1e-4, -1e-4], [1.0, -1.0, 1.0, -1.0], fn=fn)
    slopes = (grad.abs() * 4 / torch.tensor([2e-5, -2e-5, 1e-4, -1e-4]).exp()).tolist()
    assert min(slopes[:2]) > 0.7
    assert max(slopes[2:]) < 0.5
    assert m["train/clipfrac"].item() == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------
# mhpo


def _zeta(psi: float, k_pos=1.5, lambda_pos=1.0, k_neg=2.0, lambda_neg=0.8) -> float:
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    return (softplus(psi) / lambda_pos) ** k_pos + (softplus(-psi) / lambda_neg) ** k_neg


def test_mhpo_matches_the_paper_up_to_its_constant_at_scale_one():
    log_ratio, adv = [0.5, -0.5, 0.2, -1.0, 3.0], [1.0, -1.0, 2.0, 0.5, -1.5]
    loss, grad, m = run_loss("mhpo", log_ratio, adv, scale=1.0)
    c = 1.5
    psis = [c * math.tanh(x / c) for x in log_ratio]
    # The paper's objective -mean exp(psi - sg[zeta]) A, times e^zeta(0).
    paper = [math.exp(p - _zeta(p)) for p in psis]
    assert loss.item() == pytest.approx(-sum(w * a for w, a in zip(paper, adv)) / 5
                                        * math.exp(_zeta(0.0)), rel=1e-5)
    sech2 = [1.0 / math.cosh(x / c) ** 2 for x in log_ratio]
    mult = [w * math.exp(_zeta(0.0)) * s for w, s in zip(paper, sech2)]
    torch.testing.assert_close(grad, torch.tensor([-a * x / 5 for a, x in zip(adv, mult)]))
    assert m["train/clipfrac"].item() == pytest.approx(sum(x < 0.5 for x in mult) / 5)
    assert math.exp(-_zeta(0.0)) == pytest.approx(0.265, abs=1e-3)  # the paper's slope at r = 1


def test_mhpo_matches_hand_computation_at_the_flow_scale():
    scale, c = 5e-4, 1.5
    adv = [1.0, -2.0, 0.5, -1.0]
    # logp_old = 0, so the float32 log-ratios are exactly the ones computed by hand below.
    logp = torch.tensor([0.5, -0.5, 1.2, -2.0]).mul(scale).requires_grad_(True)
    loss, m = losses.get("mhpo")(logp, torch.zeros(4), torch.tensor(adv))
    loss.backward()
    u = [x / scale for x in logp.tolist()]
    psis = [c * math.tanh(x / c) for x in u]
    weights = [math.exp(scale * p - (_zeta(p) - _zeta(0.0))) for p in psis]
    assert loss.item() == pytest.approx(-sum(w * a for w, a in zip(weights, adv)) / 4, rel=1e-5)
    mult = [w / math.cosh(x / c) ** 2 for w, x in zip(weights, u)]
    torch.testing.assert_close(logp.grad, torch.tensor([-a * x / 4 for a, x in zip(adv, mult)]))
    # Multipliers ~[0.92, 0.57, 0.41, 0.020]: the last two damped by more than half.
    assert m["train/clipfrac"].item() == pytest.approx(0.5)


def _mhpo_multiplier(log_ratios: list[float], **params) -> list[float]:
    _, grad, _ = run_loss("mhpo", log_ratios, [1.0] * len(log_ratios), **params)
    return (-grad * len(log_ratios)).tolist()


def test_mhpo_damps_contraction_harder_than_expansion():
    u = [0.5, 1.0, 2.0, 3.0]
    for scale in (1.0, 5e-4):
        up = _mhpo_multiplier([x * scale for x in u], scale=scale)
        down = _mhpo_multiplier([-x * scale for x in u], scale=scale)
        assert all(d < p for d, p in zip(down, up))
    # Symmetric hazards (k_neg = k_pos, lambda_neg = lambda_pos) make the two sides equal.
    sym = {"scale": 1.0, "k_neg": 1.5, "lambda_neg": 1.0}
    up, down = _mhpo_multiplier(u, **sym), _mhpo_multiplier([-x for x in u], **sym)
    ratio_factor = [math.exp(2 * 1.5 * math.tanh(x / 1.5)) for x in u]  # exp(psi) / exp(-psi)
    torch.testing.assert_close(torch.tensor(up), torch.tensor(down) * torch.tensor(ratio_factor),
                               rtol=1e-4, atol=1e-7)


def test_mhpo_multiplier_is_bounded_and_vanishes_on_both_tails():
    u = torch.linspace(-8.0, 8.0, 321).tolist()
    mult = _mhpo_multiplier([x * 5e-4 for x in u])
    assert max(mult) <= 1.05  # just above 1 near u = 0.17: the hazard's minimum is at psi > 0
    assert min(mult) >= 0
    loss, grad, _ = run_loss("mhpo", [-50.0, 50.0], [1.0, -1.0])
    assert torch.isfinite(loss) and grad.abs().max() < 1e-12


def test_mhpo_defaults_halve_the_update_asymmetrically_around_flow_grpos_bound():
    # Half-damping at log r = -2.9e-4 (contraction) and +5.2e-4 (expansion).
    mult = _mhpo_multiplier([-2.6e-4, -3.2e-4, 4.8e-4, 5.6e-4, 1e-4, -1e-4])
    assert mult[0] > 0.5 > mult[1]
    assert mult[2] > 0.5 > mult[3]
    assert min(mult[4:]) > 0.85


# ---------------------------------------------------------------------------------------------
# mu_grpo


def test_mu_grpo_without_veto_is_clip_bit_for_bit():
    log_ratio = [0.3, -0.25, 0.05, -0.01, 2.0, -3.0]
    adv = [1.0, -1.0, -2.0, 0.5, -1.0, 1.0]
    for bounds in ({"clip_low": 0.1, "clip_high": 0.2}, {"clip_low": 1e-4, "clip_high": 1e-4}):
        loss_c, grad_c, m_c = run_loss("clip", log_ratio, adv, **bounds)
        loss_m, grad_m, m_m = run_loss("mu_grpo", log_ratio, adv, veto=None, **bounds)
        assert torch.equal(loss_c, loss_m) and torch.equal(grad_c, grad_m)
        assert all(torch.equal(m_c[k], m_m[k]) for k in m_c)


def test_mu_grpo_matches_hand_computation():
    # Defaults: relaxed region [1 - 5e-4, 1 + 5e-4], veto |log r| > 1e-4 for A < 0.
    log_ratio = [3e-4, -3e-4, 2e-4, -2e-4, 5e-5, 8e-4, 5e-3]
    adv = [1.0, 1.0, -1.0, -1.0, -2.0, 1.0, -0.5]
    loss, grad, m = run_loss("mu_grpo", log_ratio, adv)
    r = [math.exp(x) for x in log_ratio]
    # 0: A > 0 beyond Flow-GRPO's 1e-4, inside the relaxed bound: kept (clip would cut it).
    # 1: A > 0, r < 1: never cut.   2, 3: A < 0 beyond the veto: vetoed (both sides).
    # 4: A < 0 inside the veto: kept.   5: A > 0 beyond the relaxed bound: cut by the clip.
    # 6: A < 0, r >> 1: PPO keeps its gradient |A| r, the veto removes it.
    values = [-r[0], -r[1], r[2], r[3], 2 * r[4], -(1 + 5e-4), 0.5 * r[6]]
    assert loss.item() == pytest.approx(sum(values) / 7, rel=1e-6)
    expected = [-r[0] / 7, -r[1] / 7, 0.0, 0.0, 2 * r[4] / 7, 0.0, 0.0]
    torch.testing.assert_close(grad, torch.tensor(expected))
    assert m["train/clipfrac"].item() == pytest.approx(4 / 7)
    _, grad_clip, _ = run_loss("clip", log_ratio, adv)
    assert grad_clip[0] == 0 and grad_clip[6] != 0


def test_mu_grpo_veto_only_touches_negative_advantages():
    _, grad, m = run_loss("mu_grpo", [-3e-4, 3e-4], [1.0, 1.0], veto=1e-5)
    assert (grad < 0).all() and m["train/clipfrac"] == 0
    _, grad, m = run_loss("mu_grpo", [-3e-4, 3e-4], [-1.0, -1.0], veto=1e-5)
    assert (grad == 0).all() and m["train/clipfrac"] == 1
