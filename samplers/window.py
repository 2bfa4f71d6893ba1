"""Windows (MixGRPO, Li et al. 2025): which denoising steps are stochastic and trained.

A window is ``size`` consecutive step indices in ``0 .. num_steps - 1``. Steps inside are sampled
with the stochastic sampler and trained; steps outside are deterministic (Euler, or DPM-Solver++
after the window for MixGRPO-Flash, see :mod:`samplers.dpm`). The last step is excluded by
default: its update is numerically sharp (``s -> 0``) and most samplers make it deterministic.

A window is a pure function of the training iteration, so it has no state to checkpoint: resuming
needs only the iteration number (``random`` draws from ``(seed, iteration)``, not from a stream;
``decay`` and ``exp_decay`` sum the dwell times of the positions of a sweep).
"""

from __future__ import annotations

import math

from flowgrpo import seeding
from flowgrpo.validation import integer, is_integer, is_number, one_of

STRATEGIES = ("progressive", "random", "fixed", "decay", "exp_decay")


class Window:
    """Sliding window of trained steps.

    Args:
        size: number of trained steps per iteration (>= 1).
        stride: steps the window moves per shift (``progressive``, ``decay``, ``exp_decay``; >= 1).
        shift_every: training iterations between shifts (>= 1). For ``decay`` it is the dwell at
            the first position of a sweep; for ``exp_decay`` the dwell up to the threshold.
        strategy: ``"progressive"`` starts at ``start`` and moves by ``stride`` every
            ``shift_every`` iterations; when the next position would run past the last trainable
            step it rolls back to ``start`` and sweeps again. ``"random"`` draws the first step
            uniformly in ``[start, last_start]`` each iteration, seeded by ``(seed, iteration)``.
            ``"fixed"`` always begins at ``start``. ``"decay"`` and ``"exp_decay"`` sweep and roll
            back like ``progressive``, but the window stays at first step ``b`` for ``dwell(b)``
            iterations, which shrinks as the window moves to later (less noisy) steps:

            - ``decay`` (linear): with ``p = (b - start) / (b_last - start)``, ``b_last`` the
              last position of the sweep (``p = 0`` when the sweep has one position),
              ``dwell(b) = max(m, floor(M * (1 - p) + m * p))``, ``M = shift_every``, ``m =
              min_shift_every``: ``M`` at the first position, ``m`` at the last. Computed in
              integers (no float rounding).
            - ``exp_decay``: ``dwell(b) = max(m, ceil(M * exp(-decay_rate * max(0, b -
              decay_threshold))))``: ``M`` up to step ``decay_threshold``, then exponential.

            The position at iteration ``it`` is read off the accumulated dwell times: a sweep
            lasts ``C = sum(dwell(b))`` iterations over its positions ``b = start, start +
            stride, ..., <= last_start``; ``it mod C`` falls in exactly one position's span.
        start: first (lowest) step the window begins at (>= 0).
        seed: seed of the ``random`` strategy.
        exclude_last: never include the last step ``num_steps - 1`` (default True).
        min_shift_every: floor ``m`` of the dwell, in training iterations (``decay``,
            ``exp_decay``; 1 <= m <= shift_every). ``None``: ``max(1, shift_every // 4)`` for
            ``decay``, 1 for ``exp_decay`` (MixGRPO's defaults).
        decay_threshold: ``exp_decay`` only: step index (absolute, not relative to ``start``) up
            to which the dwell stays ``shift_every`` (>= 0; MixGRPO: 13).
        decay_rate: ``exp_decay`` only: ``k``, dwell decay per step of window position past the
            threshold (finite, >= 0; MixGRPO: 0.1).

    Facts from MixGRPO (github.com/Tencent-Hunyuan/MixGRPO, ``fastvideo/utils/grpo_states.py``,
    class ``GRPOTrainingStates``: ``get_dynamic_iters_per_group``,
    ``get_exp_decay_iters_per_group``, ``update_iteration``; read in a copy of that file and in
    the fork zqqqqz2000/MixGRPO, the upstream file is not indexed): the dwell ("iters per group")
    is a function of the window's current first step, not of the training iteration, so it
    shrinks over each sweep and resets after a roll back. ``decay`` interpolates linearly from
    ``max_iters_per_group`` (default ``iters_per_group``; our ``shift_every``) to
    ``min_iters_per_group`` (default ``max(1, iters_per_group // 4)``) and never goes below the
    minimum; ``exp_decay`` is ``ceil(iters_per_group * exp(-k * relu(t - 13)))``, ``k = 0.1``,
    no explicit minimum (``ceil`` of a positive number, so >= 1). Their launch script uses
    ``iters_per_group 25`` with ``max 10``, ``min 1``: ``Window(..., shift_every=10,
    min_shift_every=1, strategy="decay")``.

    Where ours differs: their progress is ``t / max_timesteps`` with ``max_timesteps =
    sampling_steps - 2`` and windows are truncated at the end (the first step may reach the last
    index); ours keeps every window whole and measures progress over the positions the sweep
    really takes, so the minimum is reached at the last position. Their linear dwell is a float
    ``int()``; ours is exact integer arithmetic. ``min_shift_every`` also floors ``exp_decay``
    (default 1, theirs). They can clip at the end instead of rolling back; ours always rolls back.
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
        min_shift_every: int | None = None,
        decay_threshold: int = 13,
        decay_rate: float = 0.1,
    ) -> None:
        for key, val, low in (("size", size, 1), ("stride", stride, 1),
                              ("shift_every", shift_every, 1), ("start", start, 0),
                              ("decay_threshold", decay_threshold, 0)):
            integer(f"window {key}", val, low)
        one_of("window strategy", strategy, STRATEGIES)
        if min_shift_every is not None and (
            not is_integer(min_shift_every) or not 1 <= min_shift_every <= shift_every
        ):
            raise ValueError(f"window min_shift_every must be an integer in [1, shift_every = "
                             f"{shift_every}] or None, got {min_shift_every!r}")
        if not is_number(decay_rate) or not math.isfinite(decay_rate) or decay_rate < 0:
            raise ValueError(f"window decay_rate must be a finite number >= 0, got {decay_rate!r}")
        self.size = size
        self.stride = stride
        self.shift_every = shift_every
        self.strategy = strategy
        self.start = start
        self.seed = int(seed)
        self.exclude_last = bool(exclude_last)
        self.min_shift_every = min_shift_every
        self.decay_threshold = decay_threshold
        self.decay_rate = float(decay_rate)

    def config(self) -> dict[str, int | float | str | bool | None]:
        """The constructor arguments."""
        return {
            "size": self.size, "stride": self.stride, "shift_every": self.shift_every,
            "strategy": self.strategy, "start": self.start, "seed": self.seed,
            "exclude_last": self.exclude_last, "min_shift_every": self.min_shift_every,
            "decay_threshold": self.decay_threshold, "decay_rate": self.decay_rate,
        }

    def __repr__(self) -> str:
        return f"Window({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"

    def _last_start(self, num_steps: int) -> int:
        """Highest first step that keeps the window inside the trainable steps, validated."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        trainable = num_steps - 1 if self.exclude_last else num_steps
        last_start = trainable - self.size
        if last_start < self.start:
            raise ValueError(
                f"window of size {self.size} starting at step {self.start} does not fit in the "
                f"{trainable} trainable steps of a {num_steps}-step schedule"
                + (" (the last step is excluded)" if self.exclude_last else "")
                + "; lower size or start, or use more steps"
            )
        return last_start

    def _min_dwell(self) -> int:
        if self.min_shift_every is not None:
            return self.min_shift_every
        return max(1, self.shift_every // 4) if self.strategy == "decay" else 1

    def dwell(self, num_steps: int, begin: int) -> int:
        """Training iterations the window stays with first step ``begin`` before it shifts
        (``shift_every`` for the non-decaying strategies)."""
        last_start = self._last_start(num_steps)
        if not self.start <= begin <= last_start:
            raise ValueError(f"begin must be in [{self.start}, {last_start}], got {begin}")
        top, low = self.shift_every, self._min_dwell()
        if self.strategy == "decay":
            # Progress over the positions the sweep takes: its last one may be < last_start.
            span = (last_start - self.start) // self.stride * self.stride
            if span == 0:
                return top
            # floor(top - (top - low) * p) with p = (begin - start) / span, in integers.
            drop = -(-(top - low) * (begin - self.start) // span)
            return max(low, top - drop)
        if self.strategy == "exp_decay":
            past = max(0, begin - self.decay_threshold)
            return max(low, math.ceil(top * math.exp(-self.decay_rate * past)))
        return top

    def bounds(self, num_steps: int, iteration: int) -> tuple[int, int]:
        """``(begin, end)`` of the window at ``iteration``: steps ``begin .. end - 1`` are trained.

        Raises:
            ValueError: if the window does not fit in the trainable steps.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        last_start = self._last_start(num_steps)
        if self.strategy == "fixed":
            begin = self.start
        elif self.strategy == "progressive":
            positions = (last_start - self.start) // self.stride + 1
            shifts = iteration // self.shift_every
            begin = self.start + (shifts % positions) * self.stride
        elif self.strategy in ("decay", "exp_decay"):
            sweep = range(self.start, last_start + 1, self.stride)
            dwells = [self.dwell(num_steps, b) for b in sweep]
            left = iteration % sum(dwells)  # iterations into the current sweep
            index = 0
            while left >= dwells[index]:
                left -= dwells[index]
                index += 1
            begin = sweep[index]
        else:
            rng = seeding.python_random("window_start", self.seed, iteration)
            begin = rng.randint(self.start, last_start)
        return begin, begin + self.size

    def steps(self, num_steps: int, iteration: int) -> list[int]:
        """Step indices (in ``0 .. num_steps - 1``) that are stochastic and trained at
        ``iteration``, ascending."""
        begin, end = self.bounds(num_steps, iteration)
        return list(range(begin, end))
