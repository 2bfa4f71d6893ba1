"""Windows (MixGRPO, Li et al. 2025): which denoising steps are stochastic and trained.

A window is ``size`` consecutive step indices in ``0 .. num_steps - 1``. Steps inside are sampled
with the stochastic sampler and trained; steps outside are deterministic (Euler, or DPM-Solver++
after the window for MixGRPO-Flash, see :mod:`samplers.dpm`). The last step is excluded by
default: its update is numerically sharp (``s -> 0``) and most samplers make it deterministic.

A window is a pure function of the training iteration, so it has no state to checkpoint: resuming
needs only the iteration number (``random`` draws from ``(seed, iteration)``, not from a stream).
"""

from __future__ import annotations

import random

STRATEGIES = ("progressive", "random", "fixed")


class Window:
    """Sliding window of trained steps.

    Args:
        size: number of trained steps per iteration (>= 1).
        stride: steps the window moves per shift (``progressive``; >= 1).
        shift_every: training iterations between shifts (``progressive``; >= 1).
        strategy: ``"progressive"`` starts at ``start`` and moves by ``stride`` every
            ``shift_every`` iterations; when the next position would run past the last trainable
            step it rolls back to ``start`` and sweeps again. ``"random"`` draws the first step
            uniformly in ``[start, last_start]`` each iteration, seeded by ``(seed, iteration)``.
            ``"fixed"`` always begins at ``start``.
        start: first (lowest) step the window begins at (>= 0).
        seed: seed of the ``random`` strategy.
        exclude_last: never include the last step ``num_steps - 1`` (default True).
    """

    def __init__(
        self,
        size: int,
        stride: int = 1,
        shift_every: int = 1,
        strategy: str = "progressive",
        start: int = 0,
        seed: int = 0,
        exclude_last: bool = True,
    ) -> None:
        for key, val, low in (("size", size, 1), ("stride", stride, 1),
                              ("shift_every", shift_every, 1), ("start", start, 0)):
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise ValueError(f"window {key} must be an integer >= {low}, got {val!r}")
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown window strategy {strategy!r}; valid: {', '.join(STRATEGIES)}"
            )
        self.size = size
        self.stride = stride
        self.shift_every = shift_every
        self.strategy = strategy
        self.start = start
        self.seed = int(seed)
        self.exclude_last = bool(exclude_last)

    def config(self) -> dict[str, int | str | bool]:
        """The constructor arguments."""
        return {
            "size": self.size, "stride": self.stride, "shift_every": self.shift_every,
            "strategy": self.strategy, "start": self.start, "seed": self.seed,
            "exclude_last": self.exclude_last,
        }

    def __repr__(self) -> str:
        return f"Window({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"

    def bounds(self, num_steps: int, iteration: int) -> tuple[int, int]:
        """``(begin, end)`` of the window at ``iteration``: steps ``begin .. end - 1`` are trained.

        Raises:
            ValueError: if the window does not fit in the trainable steps.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        trainable = num_steps - 1 if self.exclude_last else num_steps
        last_start = trainable - self.size  # highest first step that keeps the window inside
        if last_start < self.start:
            raise ValueError(
                f"window of size {self.size} starting at step {self.start} does not fit in the "
                f"{trainable} trainable steps of a {num_steps}-step schedule"
                + (" (the last step is excluded)" if self.exclude_last else "")
                + "; lower size or start, or use more steps"
            )
        if self.strategy == "fixed":
            begin = self.start
        elif self.strategy == "progressive":
            positions = (last_start - self.start) // self.stride + 1
            shifts = iteration // self.shift_every
            begin = self.start + (shifts % positions) * self.stride
        else:
            # A string seed is hashed with SHA-512 by `random`: stable across runs and processes.
            rng = random.Random(f"flowgrpo-window:{self.seed}:{iteration}")
            begin = rng.randint(self.start, last_start)
        return begin, begin + self.size

    def steps(self, num_steps: int, iteration: int) -> list[int]:
        """Step indices (in ``0 .. num_steps - 1``) that are stochastic and trained at
        ``iteration``, ascending."""
        begin, end = self.bounds(num_steps, iteration)
        return list(range(begin, end))
