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
