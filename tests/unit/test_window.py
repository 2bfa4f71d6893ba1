"""MixGRPO windows: which steps are stochastic and trained at each training iteration."""

from __future__ import annotations

import pytest

from samplers import Window


def _begins(window: Window, num_steps: int, iterations: int) -> list[int]:
    return [window.steps(num_steps, it)[0] for it in range(iterations)]


def test_progressive_shifts_then_rolls_back():
    # 6 steps, the last excluded: steps 0..4 trainable, a size-2 window begins at 0..3.
    window = Window(size=2)
    assert [window.steps(6, it) for it in range(6)] == [
        [0, 1], [1, 2], [2, 3], [3, 4], [0, 1], [1, 2]
    ]


def test_progressive_stride_shift_every_and_start():
    assert _begins(Window(size=2, shift_every=2), 6, 10) == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    # Trainable 0..6, begins allowed 0..5: 0, 2, 4, then 6 would pass the end -> back to 0.
    assert _begins(Window(size=2, stride=2), 8, 7) == [0, 2, 4, 0, 2, 4, 0]
    # The sweep starts at, and returns to, `start`.
    assert _begins(Window(size=2, start=1), 6, 7) == [1, 2, 3, 1, 2, 3, 1]
    assert Window(size=2, stride=3, shift_every=4).bounds(10, 5) == (3, 5)


def test_fixed_is_constant():
    window = Window(size=3, strategy="fixed", start=2)
    assert all(window.steps(10, it) == [2, 3, 4] for it in range(20))


def test_random_is_seeded_reproducible_and_in_range():
    window = Window(size=3, strategy="random", seed=11)
    begins = _begins(window, 10, 300)
    # Independent of call order: a fresh window asked in reverse order agrees.
    again = Window(size=3, strategy="random", seed=11)
    assert [again.steps(10, it)[0] for it in reversed(range(300))][::-1] == begins
    # Trainable 0..8: begins in 0..6, and all of them occur.
    assert set(begins) == set(range(7))
    assert _begins(Window(size=3, strategy="random", seed=12), 10, 300) != begins
    assert min(_begins(Window(size=3, strategy="random", start=4), 10, 100)) == 4


@pytest.mark.parametrize("strategy", ["progressive", "random", "fixed"])
def test_last_step_is_never_trained_by_default(strategy):
    window = Window(size=4, strategy=strategy, start=0)
    for it in range(50):
        steps = window.steps(8, it)
        assert len(steps) == 4 and 7 not in steps and min(steps) >= 0


def test_exclude_last_false_reaches_the_last_step():
    window = Window(size=2, exclude_last=False)
    assert window.steps(6, 4) == [4, 5]
    assert window.steps(6, 5) == [0, 1]
    assert Window(size=6, exclude_last=False).steps(6, 3) == list(range(6))


def test_bad_arguments_raise():
    for kwargs in ({"size": 0}, {"size": 2, "stride": 0}, {"size": 2, "shift_every": 0},
                   {"size": 2, "start": -1}, {"size": 2.5}, {"size": True}):
        with pytest.raises(ValueError, match="must be an integer"):
            Window(**kwargs)
    with pytest.raises(ValueError, match="progressive, random, fixed"):
        Window(size=2, strategy="cyclic")
    with pytest.raises(ValueError, match="does not fit in the 5 trainable steps"):
        Window(size=6).steps(6, 0)
    with pytest.raises(ValueError, match="does not fit"):
        Window(size=2, strategy="fixed", start=4).steps(6, 0)
    with pytest.raises(ValueError, match="iteration"):
        Window(size=2).steps(6, -1)


def test_config_round_trip():
    window = Window(size=3, stride=2, shift_every=5, strategy="random", start=1, seed=4)
    assert Window(**window.config()).config() == window.config()
    assert "strategy='random'" in repr(window)


def _runs(begins: list[int]) -> list[tuple[int, int]]:
    """Run-length encoding ``[(begin, iterations), ...]`` of a sequence of begins."""
    runs: list[tuple[int, int]] = []
    for b in begins:
        if runs and runs[-1][0] == b:
            runs[-1] = (b, runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def test_decay_shrinks_the_dwell_linearly_then_rolls_back():
    # 5 steps, last excluded: begins 0..3, p = b / 3, dwell = 4 - ceil(3 * b / 3) = 4, 3, 2, 1.
    window = Window(size=1, shift_every=4, min_shift_every=1, strategy="decay")
    assert [window.dwell(5, b) for b in range(4)] == [4, 3, 2, 1]
    assert _begins(window, 5, 13) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 0, 0, 0]
    # Non-integer interpolation is floored: begins 0..4, 10 * (1 - p) + p = 10, 7.75, 5.5, 3.25, 1.
    window = Window(size=1, shift_every=10, min_shift_every=1, strategy="decay")
    assert [window.dwell(6, b) for b in range(5)] == [10, 7, 5, 3, 1]
    assert _runs(_begins(window, 6, 30)) == [(0, 10), (1, 7), (2, 5), (3, 3), (4, 1), (0, 4)]


def test_decay_with_stride_start_and_default_minimum():
    # 9 steps: begins 1, 3, 5 (7 would pass last_start 6): p = 0, 1/2, 1; default min 8 // 4 = 2.
    window = Window(size=2, stride=2, start=1, shift_every=8, strategy="decay")
    assert [window.dwell(9, b) for b in (1, 3, 5)] == [8, 5, 2]
    assert _runs(_begins(window, 9, 20)) == [(1, 8), (3, 5), (5, 2), (1, 5)]
    # 10 steps: begins 1, 3, 5, 7: p = 0, 1/3, 2/3, 1.
    assert [window.dwell(10, b) for b in (1, 3, 5, 7)] == [8, 6, 4, 2]
    # The minimum is respected all along a long sweep, and the last position reaches it.
    window = Window(size=1, shift_every=9, strategy="decay")
    dwells = [window.dwell(30, b) for b in range(29)]
    assert min(dwells) == 2 == dwells[-1] and dwells[0] == 9
    assert all(a >= b for a, b in zip(dwells, dwells[1:]))
    # min == max is the progressive window.
    same = Window(size=2, shift_every=3, min_shift_every=3, strategy="decay")
    assert _begins(same, 8, 40) == _begins(Window(size=2, shift_every=3), 8, 40)


def test_exp_decay_shrinks_past_the_threshold():
    # Threshold 1, k = 1: dwell = ceil(4 * exp(-relu(b - 1))) = 4, 4, 2 (1.47), 1 (0.54), 1 (0.20).
    window = Window(size=1, shift_every=4, strategy="exp_decay", decay_threshold=1, decay_rate=1.0)
    assert [window.dwell(6, b) for b in range(5)] == [4, 4, 2, 1, 1]
    assert _runs(_begins(window, 6, 16)) == [(0, 4), (1, 4), (2, 2), (3, 1), (4, 1), (0, 4)]
    # An explicit minimum floors the decay.
    floored = Window(size=1, shift_every=4, strategy="exp_decay", decay_threshold=1,
                     decay_rate=1.0, min_shift_every=2)
    assert [floored.dwell(6, b) for b in range(5)] == [4, 4, 2, 2, 2]
    # MixGRPO's defaults (threshold 13, k = 0.1) with 25 iterations per group.
    window = Window(size=4, shift_every=25, strategy="exp_decay")
    assert [window.dwell(26, b) for b in (0, 13, 14, 15, 20, 21)] == [25, 25, 23, 21, 13, 12]
    # A huge rate still keeps the window at least one iteration per position.
    fast = Window(size=1, shift_every=3, strategy="exp_decay", decay_threshold=0, decay_rate=1e6)
    assert _begins(fast, 5, 8) == [0, 0, 0, 1, 2, 3, 0, 0]


@pytest.mark.parametrize("strategy", ["decay", "exp_decay"])
def test_decay_windows_are_pure_functions_of_the_iteration(strategy):
    window = Window(size=3, shift_every=6, strategy=strategy, decay_threshold=2, decay_rate=0.5)
    begins = _begins(window, 12, 200)
    again = Window(**window.config())
    assert [again.steps(12, it)[0] for it in reversed(range(200))][::-1] == begins
    # Every window is whole, the last step is never trained, and far iterations wrap around.
    assert all(len(window.steps(12, it)) == 3 and 11 not in window.steps(12, it)
               for it in range(200))
    cycle = sum(window.dwell(12, b) for b in range(9))
    assert window.bounds(12, 10**9 * cycle + 5) == window.bounds(12, 5)


def test_decay_bad_arguments_raise():
    for kwargs in ({"min_shift_every": 0}, {"min_shift_every": 5}, {"min_shift_every": 1.5},
                   {"min_shift_every": True}):
        with pytest.raises(ValueError, match="min_shift_every must be an integer in"):
            Window(size=2, shift_every=4, strategy="decay", **kwargs)
    with pytest.raises(ValueError, match="decay_threshold must be an integer >= 0"):
        Window(size=2, strategy="exp_decay", decay_threshold=-1)
    for rate in (-0.1, float("nan"), float("inf"), "fast", True):
        with pytest.raises(ValueError, match="decay_rate must be a finite number"):
            Window(size=2, strategy="exp_decay", decay_rate=rate)
    with pytest.raises(ValueError, match="does not fit"):
        Window(size=6, strategy="decay").steps(6, 0)
    with pytest.raises(ValueError, match="begin must be in"):
        Window(size=2, strategy="decay").dwell(6, 4)


def test_decay_config_round_trip():
    window = Window(size=3, shift_every=10, strategy="exp_decay", min_shift_every=2,
                    decay_threshold=5, decay_rate=0.3)
    assert Window(**window.config()).config() == window.config()
    assert "decay_rate=0.3" in repr(window)


@pytest.mark.parametrize("name", ["cps", "langevin", "sde"])
def test_a_window_never_trains_a_step_its_sampler_declines(name):
    """The window slides over the steps up to the last trainable one: with cps and langevin the
    step into diffusers' last nonzero sigma is never trained; sde trains it."""
    import torch

    import samplers
    from flowgrpo.rl.step_selection import STEP_SELECTIONS, trainable_steps

    sigmas = torch.tensor([1.0, 0.889, 0.778, 0.667, 0.556, 0.445, 0.334, 0.223, 0.112, 0.001, 0.0])
    sampler = samplers.get(name)
    allowed = set(trainable_steps(sampler, sigmas))
    window = STEP_SELECTIONS.get("window")(size=3)
    seen = set()
    for it in range(20):
        steps = window.select(sigmas, torch.zeros(2, dtype=torch.long), it, sampler)
        assert steps.shape == (2, 3)
        seen |= set(steps[0].tolist())
    assert seen == allowed
    assert (8 in seen) == (name == "sde")
