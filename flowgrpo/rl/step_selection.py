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
tempflow one branching step per prompt group, noise-aware      TempFlow-GRPO
         weight ``std_k / mean std``
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

    label = "flash"

    def __init__(self, seed: int = 0, steps: list | None = None, rectify: bool = True) -> None:
        super().__init__(seed)
        steps = list(steps or [])
        if any(not is_integer(k) or k < 0 for k in steps):
            raise ValueError(f"{self.label} steps must be step indices >= 0, got {steps}")
        self.steps, self.rectify = sorted(set(steps)), bool(rectify)

    def candidates(self, sigmas: torch.Tensor, sampler: Sampler) -> list[int]:
        if self.rectify and sampler.state_space is not CONTINUOUS:
            raise ValueError(f"flash's rectify weighs a step by its Gaussian's std / |b|; sampler "
                             f"{sampler.name!r} steps in tokens: set rectify: false")
        trainable = trainable_steps(sampler, sigmas)
        if not trainable:
            raise ValueError(f"{self.label} needs a stochastic sampler with trainable steps")
        if not self.steps:
            return trainable
        bad = [k for k in self.steps if k not in trainable]
        if bad:
            raise ValueError(f"{self.label} steps {bad} are not trainable steps of this schedule; "
                             f"trainable: {trainable}")
        return self.steps

    def select(self, sigmas, groups, iteration, sampler):
        candidates = self.candidates(sigmas, sampler)
        chosen = {g: self.group_step(candidates, iteration, g) for g in set(groups.tolist())}
        return torch.tensor([[chosen[g]] for g in groups.tolist()], dtype=torch.long)

    def group_step(self, candidates: list[int], iteration: int, group: int) -> int:
        """The step group ``group`` trains at ``iteration``: uniform over ``candidates``."""
        return seeding.python_random("flash_step", self.seed, iteration, group).choice(candidates)

    def weights(self, sigmas, steps, sampler):
        if not self.rectify:
            return super().weights(sigmas, steps, sampler)
        candidates = self.candidates(sigmas, sampler)
        table = rectification(sampler, sigmas, candidates)
        scale = sum(table.values()) / len(table)
        return torch.tensor([[table[int(k)] / scale for k in row] for row in steps.tolist()],
                            dtype=torch.float32)


@STEP_SELECTIONS.register("tempflow")
class TempFlowSteps(FlashSteps):
    """TempFlow-GRPO: trajectory branching at one step per prompt group, noise-aware weights.

    He et al., ICLR 2026, "TempFlow-GRPO: When Timing Matters for GRPO in Flow Models"
    (arXiv:2508.04324); code Shredded-Pork/TempFlow-GRPO at commit ``e66824e``
    (``scripts/train_sd3_pr.py``, ``flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_perstep.py``
    and ``sd3_sde_with_logprob_perstep.py``; the authors' explanation in issues #3, #4 and #11).

    Trajectory branching: a sample is deterministic (Euler) at every step but its branching step
    ``k``, where it takes the stochastic sampler's step, so its final reward is the reward of the
    action at ``k`` (a process reward without an intermediate reward model). All samples of a
    prompt group branch at the same ``k``, so the group's advantages are that step's own. This is
    the iso-temporal machinery of :class:`FlashSteps` (same candidates, same ``[B, 1]`` steps);
    what differs is which step a group gets and the loss weight.

    Which step: ``order: cycle`` (default) gives group ``g`` at iteration ``t`` the candidate
    ``(t + g) mod n`` (``n`` candidates): the groups of an iteration branch at consecutive steps
    and over any ``n`` iterations every step is branched equally often, the single-branch
    counterpart of the authors branching at every step in every iteration. ``order: random`` is
    flash's uniform draw per ``(seed, iteration, group)`` (the same random stream).

    Noise-aware weighting (``noise_aware``): the paper weights each step's policy loss by
    ``Norm(sigma_t sqrt(dt))`` (its Eq. 7), the std of the step's Gaussian. In the authors' code
    the clipped policy terms are multiplied by ``2.25 * std_dev_t``, ``std_dev_t`` being the
    transition std ``g(s) sqrt(-dt)`` their SDE step returns (``g(s) = 0.7 sqrt(s / (1 - s))``),
    and the KL term is not weighted; 2.25 is one over that std's mean over the 9 trained steps of
    SD3.5's 10-step shift-3 schedule (2.24), which keeps the weight's mean at 1 (issue #11). Here

        w_k = std_k / mean_{j in candidates} std_j,

    the same normalisation computed for the run's own schedule and sampler rather than a
    constant. ``std_k`` is read off the sampler's transition (``g(s) sqrt(-dt)`` for ``sde``,
    ``s' sin(a pi / 2)`` for ``cps``, ``sqrt(2 delta)`` for ``langevin``). The weight scales the
    advantage, which equals scaling the clipped policy terms for every registered loss (all are
    linear in the advantage at a given ratio) and leaves the KL term alone, as theirs. Unlike
    flash's ``std / |b|``, which evens out the per-step gradient scale ``|b| / std``, this weight
    leaves a step's gradient scale at ``|b|``: high-noise early steps, where a branch changes the
    reward most, are learned hardest.

    Differences from the authors' code, and why:

    - They branch at every step but the last in every iteration: per prompt ``N = 4`` initial
      noises each follow one ODE path, ``K = 6`` SDE children leave its state at each step and
      are completed by ODE, and each step's advantages are normalised over the prompt's ``N K``
      children at that step. Here a sample is one trajectory with one branch (one trained step
      ``[B, 1]``), and the rollout, which shares no prefix between samples, is the trainer's;
      the steps are spread over groups and iterations instead (``cycle``). Per sample this costs
      ``N`` model calls without gradient and one with, theirs ``N - k`` calls per child and
      ``N - 1`` trained steps per child row.
    - The seed group of the paper's later version (one initial noise for a whole group, so the
      group differs only at its branch) needs the rollout to share noise within a group; here
      each sample draws its own noise from its global index, so a group's samples also differ
      before ``k`` (as the authors' ``N > 1`` children do).

    Args:
        steps: candidate branching steps (``[]``: every step the sampler calls trainable; the
            authors': every step but the last).
        order: ``cycle`` or ``random`` (see above).
        noise_aware: apply the noise-aware weight (Gaussian steps only: a token sampler's step
            has no std, so it needs ``noise_aware: false``).
    """

    label = "tempflow"
    ORDERS = ("cycle", "random")

    def __init__(self, seed: int = 0, steps: list | None = None, order: str = "cycle",
                 noise_aware: bool = True) -> None:
        super().__init__(seed, steps=steps, rectify=False)
        if order not in self.ORDERS:
            raise ValueError(f"tempflow order must be one of {', '.join(self.ORDERS)}, "
                             f"got {order!r}")
        self.order, self.noise_aware = order, bool(noise_aware)

    def group_step(self, candidates, iteration, group):
        if self.order == "random":
            return super().group_step(candidates, iteration, group)
        return candidates[(iteration + group) % len(candidates)]

    def weights(self, sigmas, steps, sampler):
        if not self.noise_aware:
            return StepSelection.weights(self, sigmas, steps, sampler)
        if sampler.state_space is not CONTINUOUS:
            raise ValueError(f"tempflow's noise_aware weighs a step by its Gaussian's std; sampler "
                             f"{sampler.name!r} steps in tokens: set noise_aware: false")
        table = noise_levels(sampler, sigmas, self.candidates(sigmas, sampler))
        scale = sum(table.values()) / len(table)
        return torch.tensor([[table[int(k)] / scale for k in row] for row in steps.tolist()],
                            dtype=torch.float32)


def noise_levels(sampler: Sampler, sigmas: torch.Tensor, steps: list[int]) -> dict[int, float]:
    """``{k: std_k}``: the std of the sampler's Gaussian at step ``k`` of ``sigmas`` (a
    per-sample scalar, read at ``x = 0`` and ``v = 0``; a second model call, if the sampler makes
    one, sees the same zero velocity)."""
    zero = torch.zeros(1, 1)
    out = {}
    for k in steps:
        tr = sampler.transition(zero, zero, float(sigmas[k]), float(sigmas[k + 1]),
                                velocity_fn=lambda x, sigma: torch.zeros_like(x))
        out[k] = float(tr.std.reshape(-1)[0])
    return out


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
