"""Samplers against closed forms: the shared Gaussian math, the contract every registered sampler
meets, and the marginals of the analytic bed (Gaussian data, exact velocity; no models)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch.distributions import Normal, kl_divergence

import samplers
from flowgrpo.registry import UnknownNameError
from samplers.analytic import GaussianFlow, w2_to_marginal

# Parameters that make each registered sampler deterministic: it must then be the Euler step.
ZERO_NOISE = {
    "ode": [{}],
    "sde": [
        {"schedule": "flow_grpo", "noise_level": 0.0},
        {"schedule": "constant", "eta": 0.0},
        {"schedule": "linear", "g_min": 0.0, "g_max": 0.0},
    ],
    "cps": [{"noise_level": 0.0}],
    "langevin": [{"noise_level": 0.0}, {"delta": 0.0, "velocity": "model"}],
}
# A stochastic configuration of every registered sampler (and every sde schedule).
NOISY = [
    ("ode", {}),
    ("sde", {"schedule": "flow_grpo"}),
    ("sde", {"schedule": "constant", "eta": 0.5}),
    ("sde", {"schedule": "linear", "g_min": 0.1, "g_max": 0.9}),
    ("cps", {}),
    ("langevin", {}),
    ("langevin", {"velocity": "model"}),
    ("langevin", {"delta": 0.01}),
]
FLOW = GaussianFlow(mu=0.5, c=0.5)


def _step_tensors(batch: int = 6, shape: tuple[int, ...] = (3, 4, 5), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *shape, generator=g)
    v = torch.randn(batch, *shape, generator=g)
    return v, x


def _rollout(sampler, flow, sigmas, x1, noises):
    """Run ``sampler`` with the exact velocity; yields ``(s', x')`` after every step."""
    x = x1
    for k in range(len(sigmas) - 1):
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        t = sampler.transition(flow.velocity(x, s), x, s, s_next, velocity_fn=flow.velocity)
        x = samplers.sample_next(t, noise=noises[k])
        yield s_next, x


def _final(sampler, flow, sigmas, x1, noises):
    *_, (_, x) = _rollout(sampler, flow, sigmas, x1, noises)
    return x


# --------------------------------------------------------------------------- registry


def test_registry_names_and_errors():
    assert samplers.names() == ["cps", "ctmc", "langevin", "ode", "sde", "vq_diffusion"]
    assert samplers.SAMPLERS.names() == samplers.names()
    with pytest.raises(UnknownNameError, match="cps, ctmc, langevin, ode, sde, vq_diffusion"):
        samplers.get("euler")
    with pytest.raises(ValueError, match="unknown parameter.*noise_levle"):
        samplers.get("cps", noise_levle=0.5)
    with pytest.raises(ValueError, match="flow_grpo, constant, linear"):
        samplers.get("sde", schedule="cosine")
    with pytest.raises(ValueError, match="takes .*noise_level"):
        samplers.get("sde", schedule="flow_grpo", eta=0.3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        samplers.get("cps", noise_level=1.5)
    with pytest.raises(ValueError, match="reuse, model"):
        samplers.get("langevin", velocity="twice")
    with pytest.raises(ValueError, match=">= 0"):
        samplers.get("sde", schedule="constant", eta=-1.0)


@pytest.mark.parametrize("name,params", NOISY)
def test_config_round_trip(name, params):
    sampler = samplers.get(name, **params)
    assert sampler.name == name
    rebuilt = samplers.get(name, **sampler.config())
    assert rebuilt.config() == sampler.config()
    assert repr(rebuilt) == repr(sampler)


def test_import_is_cheap():
    code = (
        "import sys, samplers; heavy = {'diffusers', 'transformers', 'accelerate', 'peft', "
        "'scipy', 'sklearn'} & {m.split('.')[0] for m in sys.modules}; print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- shared math


def test_gaussian_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    mean = torch.randn(4, 3, 8, 8, generator=g)
    std = torch.rand(4, 1, 1, 1, generator=g) + 0.05
    x_next = mean + std * torch.randn(mean.shape, generator=g)
    expected = Normal(mean, std).log_prob(x_next).mean(dim=(1, 2, 3))
    got = samplers.gaussian_log_prob(x_next, mean, std)
    assert got.shape == (4,) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # weight = 1 reproduces the plain mean; a signed map is the plain mean of w * lp.
    torch.testing.assert_close(
        samplers.gaussian_log_prob(x_next, mean, std, weight=torch.ones(4, 1, 8, 8)), got
    )
    w = torch.randn(4, 1, 8, 8, generator=g)
    expected_w = (w * Normal(mean, std).log_prob(x_next)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(
        samplers.gaussian_log_prob(x_next, mean, std, weight=w), expected_w, rtol=1e-5, atol=1e-5
    )
    # Low-precision inputs are evaluated in float32.
    lp16 = samplers.gaussian_log_prob(x_next.bfloat16(), mean.bfloat16(), std)
    assert lp16.dtype == torch.float32


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 5, 16, generator=g)
    std = torch.rand(5, 1, generator=g) + 0.1
    expected = kl_divergence(Normal(a, std), Normal(b, std)).mean(dim=1)
    torch.testing.assert_close(samplers.gaussian_kl(a, b, std), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(samplers.gaussian_kl(a, a, std), torch.zeros(5))


def test_zero_std_cannot_be_trained():
    mean = torch.zeros(2, 3)
    std = torch.tensor([[0.5], [0.0]])
    with pytest.raises(ValueError, match="deterministic"):
        samplers.gaussian_log_prob(mean, mean, std)
    with pytest.raises(ValueError, match="deterministic"):
        samplers.gaussian_kl(mean, mean, std)


def test_sample_next_noise_and_generator():
    t = samplers.Transition(torch.randn(3, 4).bfloat16(), torch.full((3, 1), 0.5))
    noise = torch.randn(3, 4)
    x = samplers.sample_next(t, noise=noise)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, t.mean.float() + 0.5 * noise)
    a = samplers.sample_next(t, generator=torch.Generator().manual_seed(7))
    b = samplers.sample_next(t, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- the contract


CONTINUOUS_SAMPLERS = [name for name in samplers.names()
                       if samplers.SAMPLERS.get(name).state_space is samplers.CONTINUOUS]
"""The token samplers (ctmc, vq_diffusion) have no zero-noise limit; their steps are tested in
tests/unit/test_discrete_steps.py."""


def test_the_continuous_samplers_are_the_gaussian_ones():
    assert CONTINUOUS_SAMPLERS == ["cps", "langevin", "ode", "sde"]


@pytest.mark.parametrize("name", CONTINUOUS_SAMPLERS)
def test_zero_noise_is_the_euler_step(name):
    assert name in ZERO_NOISE, f"add the zero-noise parameters of {name!r} to ZERO_NOISE"
    v, x = _step_tensors()
    for params in ZERO_NOISE[name]:
        sampler = samplers.get(name, **params)
        assert not sampler.is_stochastic and not sampler.needs_model_call
        for s, s_next in [(1.0, 0.8), (0.6, 0.35), (0.2, 0.0)]:
            t = sampler.transition(v, x, s, s_next)
            # dt in float32, as every sampler computes it: then the equality is bit for bit.
            dt = torch.tensor(s_next) - torch.tensor(s)
            assert torch.equal(t.mean, x + dt * v), (params, s)
            torch.testing.assert_close(t.mean, x + (s_next - s) * v, rtol=0.0, atol=1e-6)
            assert torch.equal(t.std, torch.zeros(x.shape[0], 1, 1, 1))


@pytest.mark.parametrize("name,params", NOISY)
def test_shapes_dtypes_and_std(name, params):
    sampler = samplers.get(name, **params)
    v, x = _step_tensors()
    t = sampler.transition(v.bfloat16(), x.bfloat16(), 0.7, 0.6, velocity_fn=FLOW.velocity)
    assert t.mean.shape == x.shape and t.mean.dtype == torch.float32
    assert t.std.shape == (x.shape[0], 1, 1, 1) and t.std.dtype == torch.float32
    assert bool((t.std > 0).all()) == sampler.is_stochastic
    x_next = samplers.sample_next(t, generator=torch.Generator().manual_seed(0))
    if sampler.is_stochastic:
        # Recomputing the step's log-prob from the same inputs gives a ratio of exactly 1.
        again = sampler.transition(v.bfloat16(), x.bfloat16(), 0.7, 0.6, FLOW.velocity)
        lp = samplers.gaussian_log_prob(x_next, t.mean, t.std)
        assert torch.equal(samplers.gaussian_log_prob(x_next, again.mean, again.std), lp)


@pytest.mark.parametrize("name,params", NOISY)
def test_per_sample_sigmas_equal_a_loop_over_floats(name, params):
    sampler = samplers.get(name, **params)
    v, x = _step_tensors(batch=5)
    sigma = torch.tensor([1.0, 0.9, 0.5, 0.3, 0.1])
    sigma_next = torch.tensor([0.95, 0.7, 0.45, 0.1, 0.0])
    batched = sampler.transition(v, x, sigma, sigma_next, velocity_fn=FLOW.velocity)
    for i in range(5):
        single = sampler.transition(
            v[i : i + 1], x[i : i + 1], float(sigma[i]), float(sigma_next[i]), FLOW.velocity
        )
        torch.testing.assert_close(batched.mean[i : i + 1], single.mean, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(batched.std[i : i + 1], single.std, rtol=1e-6, atol=0.0)


def test_bad_sigma_shape_raises():
    v, x = _step_tensors(batch=4)
    with pytest.raises(ValueError, match="one value per sample"):
        samplers.get("ode").transition(v, x, torch.ones(3), 0.5)


# --------------------------------------------------------------------------- sde


def test_sde_mean_is_flow_grpo_published_form():
    g = torch.Generator().manual_seed(3)
    v, x = _step_tensors(batch=16, seed=3)
    s = torch.rand(16, generator=g) * 0.9 + 0.05
    s_next = s * torch.rand(16, generator=g)
    sampler = samplers.get("sde", noise_level=0.8)
    t = sampler.transition(v, x, s, s_next)
    s4, dt = s.view(-1, 1, 1, 1), (s_next - s).view(-1, 1, 1, 1)
    g2 = 0.8**2 * s4 / (1 - s4)
    published = x * (1 + g2 * dt / (2 * s4)) + v * (1 + g2 * (1 - s4) / (2 * s4)) * dt
    torch.testing.assert_close(t.mean, published, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t.std, torch.sqrt(g2 * -dt), rtol=1e-6, atol=0.0)
    # At s = 1 Flow-GRPO evaluates the denominator at the next level.
    first = sampler.transition(v, x, 1.0, 0.9)
    expected = 0.8 * math.sqrt(1.0 / (1.0 - 0.9)) * math.sqrt(0.1)
    torch.testing.assert_close(first.std, torch.full_like(first.std, expected))


def _moment_tolerances(n: int, var: float) -> tuple[float, float]:
    """Four standard errors of the sample mean and of the sample variance of a Gaussian."""
    return 4 * math.sqrt(var / n), 4 * var * math.sqrt(2 / (n - 1))


@pytest.mark.parametrize(
    "params",
    [{"schedule": "flow_grpo"}, {"schedule": "constant"}, {"schedule": "linear"}],
)
def test_sde_keeps_data_mean_and_variance(params):
    steps, n = 100, 50_000
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    g = torch.Generator().manual_seed(4)
    x1, noises = torch.randn(n, generator=g), torch.randn(steps, n, generator=g)
    x = _final(samplers.get("sde", **params), FLOW, sigmas, x1, noises)
    # Euler-Maruyama is first order: allow the deterministic Euler step's own (exactly computed)
    # variance error on this grid on top of the Monte-Carlo error.
    ode_gain = _final(samplers.get("ode"), FLOW, sigmas, torch.tensor([0.0, 1.0]), noises[:, :2])
    discretization = abs(float(ode_gain[1] - ode_gain[0]) ** 2 - FLOW.c**2)
    tol_mean, tol_var = _moment_tolerances(n, FLOW.c**2)
    assert abs(x.mean().item() - FLOW.mu) < tol_mean
    assert abs(x.var().item() - FLOW.c**2) < tol_var + discretization


# --------------------------------------------------------------------------- cps


@pytest.mark.parametrize("noise_level", [0.3, 0.7, 1.0])
def test_cps_point_mass_keeps_every_marginal(noise_level):
    flow, steps, n = GaussianFlow(mu=0.5, c=0.0), 10, 40_000
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    g = torch.Generator().manual_seed(5)
    x1, noises = torch.randn(n, generator=g), torch.randn(steps, n, generator=g)
    cps = samplers.get("cps", noise_level=noise_level)
    for s_next, x in _rollout(cps, flow, sigmas, x1, noises):
        mean, std = flow.marginal(s_next)
        tol_mean, tol_var = _moment_tolerances(n, std**2)
        assert abs(x.mean().item() - mean) <= tol_mean + 1e-6, s_next
        assert abs(x.var().item() - std**2) <= tol_var + 1e-6, s_next
    assert torch.allclose(x, torch.full_like(x, flow.mu), atol=1e-6)


def test_cps_shrinks_variance_of_spread_data():
    # Not a discretization of the marginal SDE (docs/design.md, "Samplers"): with c > 0 its
    # variance falls short.
    steps, n = 100, 20_000
    g = torch.Generator().manual_seed(6)
    x1, noises = torch.randn(n, generator=g), torch.randn(steps, n, generator=g)
    x = _final(samplers.get("cps"), FLOW, torch.linspace(1.0, 0.0, steps + 1), x1, noises)
    assert x.var().item() < 0.8 * FLOW.c**2


# --------------------------------------------------------------------------- langevin


def test_langevin_last_step_is_plain_euler():
    v, x = _step_tensors()

    def no_call(x, sigma):
        raise AssertionError("the last step must not call the model")

    for velocity in ("reuse", "model"):
        t = samplers.get("langevin", velocity=velocity).transition(v, x, 0.25, 0.0, no_call)
        assert torch.equal(t.mean, x - 0.25 * v)
        assert torch.equal(t.std, torch.zeros_like(t.std))


def test_langevin_model_velocity_requires_velocity_fn():
    v, x = _step_tensors()
    sampler = samplers.get("langevin", velocity="model")
    assert sampler.needs_model_call and not samplers.get("langevin").needs_model_call
    with pytest.raises(ValueError, match="velocity_fn"):
        sampler.transition(v, x, 0.5, 0.4)


def test_langevin_calls_model_at_euler_point_and_matches_sde_randomness():
    v, x = _step_tensors(batch=3)
    sigma, sigma_next = torch.tensor([1.0, 0.6, 0.3]), torch.tensor([0.8, 0.5, 0.1])
    calls = []

    def velocity_fn(x_e, s):
        calls.append((x_e.clone(), s.clone()))
        return FLOW.velocity(x_e, s)

    t = samplers.get("langevin", velocity="model").transition(v, x, sigma, sigma_next, velocity_fn)
    (x_e, s), = calls
    dt = (sigma_next - sigma).view(-1, 1, 1, 1)
    torch.testing.assert_close(x_e, x + dt * v)
    assert torch.equal(s, sigma_next)
    sde = samplers.get("sde", noise_level=0.7).transition(v, x, sigma, sigma_next)
    torch.testing.assert_close(t.std, sde.std, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("steps", [4, 10])
def test_langevin_model_call_beats_euler_in_w2(steps):
    # Measured on the 1-D bed (mu = c = 0.5, noise 0.7, uniform grid; see
    # benchmarks/sampler_marginals.py): with a second model call the correction clearly reduces
    # the final 2-Wasserstein error of the plain Euler step. The reuse variant does not do so
    # reliably (it is worse than Euler at 10 steps), so nothing is claimed for it.
    n = 50_000
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    g = torch.Generator().manual_seed(8)
    x1, noises = torch.randn(n, generator=g), torch.randn(steps, n, generator=g)
    w2_ode = w2_to_marginal(_final(samplers.get("ode"), FLOW, sigmas, x1, noises), FLOW)
    langevin = samplers.get("langevin", velocity="model")
    w2_langevin = w2_to_marginal(_final(langevin, FLOW, sigmas, x1, noises), FLOW)
    assert w2_langevin < 0.7 * w2_ode, (w2_langevin, w2_ode)


def test_langevin_does_not_train_steps_into_tiny_noise_levels():
    """Into s' = 1e-3 (diffusers' last nonzero sigma) the corrector's delta / s'^2 is in the
    thousands; such steps are left out of training, like cps's."""
    from flowgrpo.rl.step_selection import trainable_steps

    sigmas = torch.tensor([1.0, 0.889, 0.778, 0.667, 0.556, 0.445, 0.334, 0.223, 0.112, 0.001, 0.0])
    lang = samplers.get("langevin")
    assert trainable_steps(lang, sigmas) == list(range(8))
    assert trainable_steps(samplers.get("langevin", min_train_sigma=0.0), sigmas) == list(range(9))
    v, x = _step_tensors()
    tr = lang.transition(v, x, 0.112, 0.001)
    delta = float(tr.std.flatten()[0]) ** 2 / 2
    assert delta / 0.001**2 > 1000  # why: the step would be a wild gradient step
    with pytest.raises(ValueError, match="min_train_sigma"):
        samplers.get("langevin", min_train_sigma=1.0)
