"""DPM-Solver++(2M) and the MixGRPO-Flash tail against the exact flow of Gaussian data."""

from __future__ import annotations

import pytest
import torch

import samplers
from samplers.analytic import GaussianFlow


def _euler(flow: GaussianFlow, x: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    for s, s_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        x = x + (s_next - s) * flow.velocity(x, s)
    return x


def _shifted(num_steps: int, shift: float = 3.0) -> torch.Tensor:
    s = torch.linspace(1.0, 0.0, num_steps + 1)
    return shift * s / (1 + (shift - 1) * s)


X1 = torch.linspace(-3.0, 3.0, 61).reshape(61, 1)


def test_flash_sigmas_counts_and_grid():
    sigmas = _shifted(10)
    tail = samplers.flash_sigmas(sigmas, window_end=4, ratio=0.5)  # floor(6 * 0.5) = 3 steps
    assert tail.shape == (4,) and tail.dtype == sigmas.dtype
    assert tail[0] == sigmas[4] and tail[-1] == 0.0
    torch.testing.assert_close(tail, torch.linspace(float(sigmas[4]), 0.0, 4))
    assert samplers.flash_sigmas(sigmas, 4, 0.1).numel() == 2  # floor(0.6) = 0 -> at least 1
    assert samplers.flash_sigmas(sigmas, 0, 0.7).numel() == 8  # 10 * 0.7 counts as 7
    assert samplers.flash_sigmas(sigmas, 9, 1.0).tolist() == [float(sigmas[9]), 0.0]
    with pytest.raises(ValueError, match="window_end"):
        samplers.flash_sigmas(sigmas, 10, 0.5)
    with pytest.raises(ValueError, match="ratio"):
        samplers.flash_sigmas(sigmas, 2, 0.0)


def test_point_mass_is_solved_exactly():
    # With c = 0 the data prediction is exactly mu everywhere, so the solver is exact.
    flow = GaussianFlow(mu=0.5, c=0.0)
    for sigmas in (torch.linspace(1.0, 0.0, 4), _shifted(3), torch.tensor([1.0, 0.0])):
        out = samplers.dpm_solver_2m(flow.velocity, X1, sigmas)
        torch.testing.assert_close(out, torch.full_like(X1, 0.5), rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("num_steps", [4, 6, 10])
@pytest.mark.parametrize("shifted", [False, True])
def test_beats_euler_at_equal_model_calls(num_steps, shifted):
    # The exact ODE maps noise x1 to mu + c * x1 (the flow of Gaussian data is affine).
    flow = GaussianFlow(mu=0.5, c=0.5)
    sigmas = _shifted(num_steps) if shifted else torch.linspace(1.0, 0.0, num_steps + 1)
    exact = flow.ode_solution(X1, 0.0)
    calls = []

    def velocity_fn(x, sigma):
        calls.append(sigma)
        assert sigma.shape == (x.shape[0],)
        return flow.velocity(x, sigma)

    dpm_error = (samplers.dpm_solver_2m(velocity_fn, X1, sigmas) - exact).abs().max()
    euler_error = (_euler(flow, X1, sigmas) - exact).abs().max()
    assert len(calls) == num_steps
    assert dpm_error < euler_error, (dpm_error, euler_error)
    if num_steps >= 6 and not shifted:
        # On shifted grids both end with the same large first-order step to 0 (x0_hat from
        # s ~ 3/N), which dominates, so only the strict improvement is claimed there.
        assert dpm_error < 0.5 * euler_error, (dpm_error, euler_error)


def test_flash_tail_from_the_window_end():
    # MixGRPO-Flash: after the window, solve the re-gridded tail from the exact latent there.
    flow = GaussianFlow(mu=-0.3, c=0.8)
    sigmas = _shifted(20)
    tail = samplers.flash_sigmas(sigmas, window_end=6, ratio=0.5)  # 7 steps instead of 14
    x = flow.ode_solution(X1, float(sigmas[6]))
    exact = flow.ode_solution(X1, 0.0)
    dpm_error = (samplers.dpm_solver_2m(flow.velocity, x, tail) - exact).abs().max()
    euler_full = (_euler(flow, x, sigmas[6:]) - exact).abs().max()
    assert dpm_error < euler_full, (dpm_error, euler_full)


def test_first_step_from_pure_noise_is_euler_and_dtype():
    flow = GaussianFlow(mu=0.5, c=0.5)
    out = samplers.dpm_solver_2m(flow.velocity, X1.double(), torch.tensor([1.0, 0.6]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, X1 - 0.4 * flow.velocity(X1, 1.0))


def test_bad_sigmas_raise():
    flow = GaussianFlow()
    with pytest.raises(ValueError, match="descending"):
        samplers.dpm_solver_2m(flow.velocity, X1, torch.tensor([0.2, 0.5, 0.0]))
    with pytest.raises(ValueError, match="descending"):
        samplers.dpm_solver_2m(flow.velocity, X1, torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        samplers.dpm_solver_2m(flow.velocity, X1, torch.tensor([1.5, 0.0]))
