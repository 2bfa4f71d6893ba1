"""TempFlow-GRPO's step selection: the noise-aware weight against its formula, the branching
step of each group, and its errors."""

from __future__ import annotations

import math

import pytest
import torch

import samplers
from flowgrpo.cli.ablate import load_presets
from flowgrpo.rl import step_selection as steps


def hand_weights(sigmas: list[float], ks: list[int], a: float = 0.7) -> list[float]:
    """Flow-GRPO's SDE std ``g(s) sqrt(s - s')``, ``g(s) = a sqrt(s / (1 - s~))`` with
    ``s~ = sigmas[1]`` at ``s = 1``, divided by its mean over ``ks``."""
    def std(k: int) -> float:
        s, s_next = sigmas[k], sigmas[k + 1]
        s_tilde = sigmas[1] if s == 1 else s
        return a * math.sqrt(s / (1 - s_tilde)) * math.sqrt(s - s_next)

    mean = sum(std(k) for k in ks) / len(ks)
    return [std(k) / mean for k in ks]


def test_noise_aware_weight_is_the_normalised_sde_std_on_a_small_grid():
    grid = [1.0, 0.8, 0.5, 0.2, 0.0]
    sigmas = torch.tensor(grid)
    sampler = samplers.get("sde", noise_level=0.7)
    selection = steps.build("tempflow")
    assert steps.trainable_steps(sampler, sigmas) == [0, 1, 2]  # never the last step
    got = selection.weights(sigmas, torch.tensor([[0], [1], [2], [1]]), sampler)
    want = hand_weights(grid, [0, 1, 2])
    assert got.shape == (4, 1) and got.dtype == torch.float32
    torch.testing.assert_close(got[:, 0], torch.tensor(want + [want[1]]), rtol=1e-5, atol=0)
    assert abs(float(got[:3].mean()) - 1) < 1e-6  # mean 1 over the candidates
    # the low-noise last candidate weighs least
    assert want[2] < min(want[0], want[1])


def test_restricted_candidates_normalise_over_themselves_and_the_weight_can_be_off():
    grid = [1.0, 0.8, 0.5, 0.2, 0.0]
    sigmas = torch.tensor(grid)
    sampler = samplers.get("sde", noise_level=0.7)
    got = steps.build("tempflow", steps=[1, 2]).weights(sigmas, torch.tensor([[1], [2]]), sampler)
    torch.testing.assert_close(got[:, 0], torch.tensor(hand_weights(grid, [1, 2])), rtol=1e-5,
                               atol=0)
    off = steps.build("tempflow", noise_aware=False)
    assert torch.equal(off.weights(sigmas, torch.tensor([[0], [2]]), sampler), torch.ones(2, 1))


def test_the_authors_constant_is_one_over_the_mean_std_of_their_schedule():
    """Their loss weight is ``2.25 * std``: on SD3.5's 10-step shift-3 schedule with a = 0.7,
    2.25 is one over the std's mean over the 9 trained steps, so ours equals theirs there."""
    base = torch.linspace(1, 0.1, 10)
    sigmas = torch.cat([3 * base / (1 + 2 * base), torch.zeros(1)])
    sampler = samplers.get("sde", noise_level=0.7)
    candidates = steps.trainable_steps(sampler, sigmas)
    assert candidates == list(range(9))
    stds = steps.noise_levels(sampler, sigmas, candidates)
    assert abs(len(stds) / sum(stds.values()) - 2.25) < 0.02
    ours = steps.build("tempflow").weights(sigmas, torch.tensor([candidates]), sampler)[0]
    theirs = torch.tensor([2.25 * stds[k] for k in candidates])
    torch.testing.assert_close(ours, theirs, rtol=0.01, atol=0)


def test_noise_level_is_the_sampler_std_for_every_gaussian_sampler():
    sigmas = torch.linspace(1, 0, 7)
    for name in ("sde", "cps", "langevin"):
        sampler = samplers.get(name)
        for k, std in steps.noise_levels(sampler, sigmas, [1, 3]).items():
            x = torch.randn(2, 5)
            tr = sampler.transition(torch.randn(2, 5), x, float(sigmas[k]), float(sigmas[k + 1]),
                                    velocity_fn=lambda y, s: torch.zeros_like(y))
            assert abs(float(tr.std.reshape(-1)[0]) - std) < 1e-6, (name, k)


def test_cycle_gives_groups_consecutive_steps_and_covers_every_step_evenly():
    sigmas = torch.linspace(1, 0, 7)  # 6 steps, candidates 0..4
    sampler = samplers.get("sde")
    selection = steps.build("tempflow")
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    counts = {k: 0 for k in range(5)}
    for t in range(5):
        chosen = selection.select(sigmas, groups, t, sampler)
        assert chosen.shape == (9, 1)
        for g in range(3):
            picked = chosen[groups == g, 0]
            assert (picked == (t + g) % 5).all()  # the group shares its branching step
            counts[int(picked[0])] += 1
    assert set(counts.values()) == {3}  # 5 iterations, 3 groups: every step 3 times


def test_random_order_is_flash_draw_and_candidates_are_checked():
    sigmas = torch.linspace(1, 0, 11)
    sampler = samplers.get("sde")
    groups = torch.arange(8).repeat_interleave(2)
    rand = steps.build("tempflow", seed=3, order="random", steps=[0, 2, 4])
    flash = steps.build("flash", seed=3, steps=[0, 2, 4])
    for t in range(3):
        assert torch.equal(rand.select(sigmas, groups, t, sampler),
                           flash.select(sigmas, groups, t, sampler))
    with pytest.raises(ValueError, match="tempflow steps \\[9\\] are not trainable"):
        steps.build("tempflow", steps=[9]).select(sigmas, groups, 0, sampler)
    with pytest.raises(ValueError, match="tempflow order must be one of cycle, random"):
        steps.build("tempflow", order="every")
    with pytest.raises(ValueError, match="tempflow steps must be step indices"):
        steps.build("tempflow", steps=[-1])


def test_a_token_sampler_needs_the_weight_off():
    sampler = samplers.get("ctmc")
    sigmas = torch.linspace(1, 0, 5)
    with pytest.raises(ValueError, match="noise_aware: false"):
        steps.build("tempflow").weights(sigmas, torch.tensor([[0]]), sampler)


def test_the_preset_names_the_step_selection():
    preset = load_presets()["tempflow_grpo"]
    assert preset["train.step_selection"] == "tempflow"
    steps.build(preset["train.step_selection"], **preset.get("train.step_selection_params", {}))
