"""Step selection: which steps of which sample are stochastic and trained, and their loss weight.

A step selection (registry, config ``train.step_selection``) returns ``[B, J]`` step indices per
iteration: every sample trains ``J`` steps, not necessarily the same ones. The rollout samples
those steps with the stochastic sampler and the others deterministically (Euler), and the
objective replays them. :meth:`StepSelection.weights` is the per-step loss-weight hook (ones by
default); Flash-GRPO uses it for its temporal gradient rectification.

Every selection is a pure function of ``(seed, iteration, group id)``: nothing to checkpoint,
the same on every process, and resumable.

======== ===================================================== =================================
name     steps                                                 reference
======== ===================================================== =================================
all      every step the sampler calls trainable (not the last) Flow-GRPO
window   a MixGRPO window, the same for the whole batch        MixGRPO (:class:`samplers.Window`)
flash    one step per prompt group, all its samples at it      Flash-GRPO
======== ===================================================== =================================
"""

from __future__ import annotations

from typing import Any

import torch

import samplers
from flowgrpo import seeding
from flowgrpo.registry import Registry
from flowgrpo.validation import is_integer
from samplers import CONTINUOUS, Sampler

STEP_SELECTIONS: Registry[type[StepSelection]] = Registry("step selection")


def trainable_steps(sampler: Sampler, sigmas: torch.Tensor) -> list[int]:
    """Steps ``k`` of ``sigmas`` (``[N+1]``) the sampler calls trainable; never the last."""
    s = sigmas.tolist()
    return [k for k in range(len(s) - 2) if sampler.trainable(s[k], s[k + 1])]


class StepSelection:
    """Base class: subclasses take their parameters as keyword arguments (plus ``seed``)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def select(self, sigmas: torch.Tensor, groups: torch.Tensor, iteration: int,
               sampler: Sampler) -> torch.Tensor:
        """``[B, J]`` long step indices for the samples of ``groups`` (``[B]`` global ids)."""
        raise NotImplementedError

    def weights(self, sigmas: torch.Tensor, steps: torch.Tensor,
                sampler: Sampler) -> torch.Tensor:
        """``[B, J]`` float32 loss weight of each selected step (ones: no reweighting)."""
        return torch.ones(steps.shape)


def _shared(steps: list[int], batch: int) -> torch.Tensor:
    return torch.tensor(steps, dtype=torch.long).reshape(1, -1).expand(batch, -1).clone()


@STEP_SELECTIONS.register("all")
class AllSteps(StepSelection):
    """Every step the sampler calls trainable, the same for every sample (Flow-GRPO)."""

    def select(self, sigmas, groups, iteration, sampler):
        return _shared(trainable_steps(sampler, sigmas), len(groups))


@STEP_SELECTIONS.register("window")
class WindowSteps(StepSelection):
    """A MixGRPO window (:class:`samplers.Window`), the same for every sample.

    Params are the window's: ``size``, ``stride``, ``shift_every``, ``strategy`` (``progressive``,
    ``random``, ``fixed``, ``decay``, ``exp_decay``), ``start`` and the decay parameters. The
    window slides over the steps up to the last one the sampler calls trainable (``exclude_last``
    has already dropped the final step, which no sampler trains): a sampler that declines the
    steps into tiny noise levels (``cps``, ``langevin``) never has them trained by a window.
    """

    def __init__(self, seed: int = 0, **window: Any) -> None:
        super().__init__(seed)
        window.setdefault("size", 2)
        self.window = samplers.Window(**window, seed=self.seed)

    def select(self, sigmas, groups, iteration, sampler):
        trainable = trainable_steps(sampler, sigmas)
        if not trainable:
            raise ValueError("window needs a stochastic sampler with trainable steps")
        # the window's schedule ends at the last trainable step (plus the excluded last one)
        num = trainable[-1] + (2 if self.window.exclude_last else 1)
        return _shared(self.window.steps(num, iteration), len(groups))


@STEP_SELECTIONS.register("flash")
class FlashSteps(StepSelection):
    """Flash-GRPO's iso-temporal grouping: each prompt group trains one step per iteration.

    All samples of a group are stochastic and trained at the group's step and deterministic
    elsewhere; the step is drawn uniformly from the candidates for every ``(iteration, group)``,
    so it varies across groups and iterations.

    Temporal gradient rectification (``rectify``): the gradient of a step's log-prob has a scale
    that depends on the step. A stochastic transition has a mean affine in the velocity,
    ``mean = a + b(s, s') v`` (``b`` a per-sample scalar), and a std ``sigma(s, s')``. For the
    stored ``x' = mean_old + sigma eps``, per element

        d log p / d v = (x' - mean) / sigma^2 * d mean / d v = eps * b / sigma,

    so with ``eps ~ N(0, I)`` the log-prob gradient through the velocity has scale ``|b| /
    sigma``. For Flow-GRPO's SDE (``sigma = g sqrt(-dt)``, ``b = dt (1 + g^2 (1 - s) / (2 s))``)
    that is ``sqrt(-dt) (1 + g^2 (1 - s) / (2 s)) / g``: it varies by an order of magnitude over
    a shifted schedule. The weight ``w = sigma / |b|`` cancels it; weights are divided by their
    mean over the candidate steps, so the learning rate keeps its meaning. ``b`` is read off the
    sampler itself (its mean at ``v = 1`` minus at ``v = 0``), so the rule holds for every
    registered sampler.

    Checked against the authors' code (Shredded-Pork/Flash-GRPO, ``scripts/train_wanx2_1_flash.py``
    and its SDE step): their weight ``coe_t = 1 / (sqrt(-dt) / g + g sqrt(-dt) (1 - s) / (2 s))``
    is this ``std / |b|`` for their SDE; they multiply the clipped policy terms by it, which
    equals scaling the advantage (ours) for every registered loss, since all are linear in the
    advantage at a given ratio. Differences: they normalise by the weight's mean over the
    drawn batch, we by its mean over the candidate steps (a constant of the run); they draw the
    step from the first half of the schedule with Python's global RNG, we from ``steps`` (all
    trainable steps by default) seeded by ``(seed, iteration, group)``.

    Args:
        steps: candidate step indices (``[]``: every step the sampler calls trainable).
        rectify: apply the temporal gradient rectification weight (Gaussian steps only: a
            token sampler's step has no ``std / |b|``, so it needs ``rectify: false``).
    """

    def __init__(self, seed: int = 0, steps: list | None = None, rectify: bool = True) -> None:
        super().__init__(seed)
        steps = list(steps or [])
        if any(not is_integer(k) or k < 0 for k in steps):
            raise ValueError(f"flash steps must be step indices >= 0, got {steps}")
        self.steps, self.rectify = sorted(set(steps)), bool(rectify)

    def candidates(self, sigmas: torch.Tensor, sampler: Sampler) -> list[int]:
        if self.rectify and sampler.state_space is not CONTINUOUS:
            raise ValueError(f"flash's rectify weighs a step by its Gaussian's std / |b|; sampler "
                             f"{sampler.name!r} steps in tokens: set rectify: false")
        trainable = trainable_steps(sampler, sigmas)
        if not trainable:
            raise ValueError("flash needs a stochastic sampler with trainable steps")
        if not self.steps:
            return trainable
        bad = [k for k in self.steps if k not in trainable]
        if bad:
            raise ValueError(f"flash steps {bad} are not trainable steps of this schedule; "
                             f"trainable: {trainable}")
        return self.steps

    def select(self, sigmas, groups, iteration, sampler):
        candidates = self.candidates(sigmas, sampler)
        chosen = {}
        for g in sorted(set(groups.tolist())):
            rng = seeding.python_random("flash_step", self.seed, iteration, g)
            chosen[g] = rng.choice(candidates)
        return torch.tensor([[chosen[g]] for g in groups.tolist()], dtype=torch.long)

    def weights(self, sigmas, steps, sampler):
        if not self.rectify:
            return super().weights(sigmas, steps, sampler)
        candidates = self.candidates(sigmas, sampler)
        table = rectification(sampler, sigmas, candidates)
        scale = sum(table.values()) / len(table)
        return torch.tensor([[table[int(k)] / scale for k in row] for row in steps.tolist()],
                            dtype=torch.float32)


def rectification(sampler: Sampler, sigmas: torch.Tensor, steps: list[int]) -> dict[int, float]:
    """``{k: std_k / |b_k|}``: the inverse of the log-prob gradient's scale at step ``k`` (see
    :class:`FlashSteps`), from the sampler's own transition: ``b`` is its mean at ``v = 1``
    minus its mean at ``v = 0`` (from ``x = 0``; a second model call, if the sampler makes one,
    sees the same constant velocity)."""
    zero, one = torch.zeros(1, 1), torch.ones(1, 1)
    out = {}
    for k in steps:
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        means = []
        for v in (one, zero):
            tr = sampler.transition(v, zero, s, s_next,
                                    velocity_fn=lambda x, sigma, v=v: v.expand_as(x))
            means.append(tr.mean)
        slope = float((means[0] - means[1]).abs().reshape(-1)[0])
        out[k] = float(tr.std.reshape(-1)[0]) / max(slope, 1e-12)
    return out


def build(name: str, seed: int = 0, **params: Any) -> StepSelection:
    """The step selection registered as ``name`` with its parameters.

    Raises:
        UnknownNameError: unknown ``name``; ParameterError (a TypeError and a ValueError): an
            unknown parameter; ValueError: a bad value.
    """
    return STEP_SELECTIONS.build(name, seed=seed, **params)
