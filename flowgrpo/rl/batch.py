"""A rollout batch: trajectories, prompts, group ids and rewards of one epoch on one process."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flowgrpo.rl.rollout import Trajectory
from pipelines import Cond
from reward_models import RewardOutput


def chunks(n: int, size: int) -> list[slice]:
    """``[0, n)`` cut into consecutive slices of at most ``size``."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def cat_trajectories(trajs: list[Trajectory]) -> Trajectory:
    """Concatenate rollouts of the same schedule along the batch."""
    first = trajs[0]
    return Trajectory(
        latents=torch.cat([t.latents for t in trajs]),
        sigmas=first.sigmas,
        trained=torch.cat([t.trained for t in trajs]),
        log_probs=torch.cat([t.log_probs for t in trajs]),
        cond=Cond.cat([t.cond for t in trajs]),
    )


@dataclass
class GlobalView:
    """An epoch's batch metadata over every process, in global sample order: gathered once per
    epoch and sliced per process (:meth:`mine`).

    Attributes:
        groups: ``[N]`` global group ids.
        valid: ``[N]`` bool, False for the samples of skipped groups.
        advantages: ``[N, V, J, P]`` advantages.
        rank, size: this process's index and its number of samples ``B``: its rows are
            ``rank * B`` to ``(rank + 1) * B``.
        issued: the advantages this process was handed (its rows of ``advantages``, in the
            shape they were computed in); an update given other advantages gathers its own view.
        sample_weights: ``[N]`` importance weights, once pruned.
    """

    groups: torch.Tensor
    valid: torch.Tensor
    advantages: torch.Tensor
    rank: int
    size: int
    issued: torch.Tensor | None = None
    sample_weights: torch.Tensor | None = None

    def mine(self, values: torch.Tensor) -> torch.Tensor:
        """This process's rows of a global ``[N, ...]`` tensor."""
        return values[self.rank * self.size:(self.rank + 1) * self.size]


@dataclass
class RolloutBatch:
    """Everything one process rolled out in an epoch, and what later phases add to it.

    Attributes:
        traj: the concatenated trajectories ``[B, ...]`` (trained steps ``[B, J]``).
        prompts, metadata: ``B`` prompts and their metadata (with ``"group"``).
        groups: ``[B]`` global group ids.
        reward: the reward output for the batch (scores ``[B]``).
        step_weights: ``[B, J]`` per-step loss weights from the step selection.
        views: the conditions training replays under, ``V`` encodings of the ``B`` samples;
            view 0 is the rollout's own (MV-GRPO adds more).
        view_rewards: the reward output under each view (``view_rewards[0] is reward``).
        advantages: ``[B, V, J, P]`` once computed (per view, trained step and region).
        regions: ``[P, ...]`` region membership maps on the latent grid (region rewards), or
            None.
        info: scalar metrics the later phases report (averaged over processes).
        sample_weights: ``[B]`` importance weights of the samples (1 unless pruned).
        iteration: the training iteration the batch belongs to.
        index: ``[B]`` global sample indices (rank * B + i): what per-sample randomness is
            keyed by, so it does not depend on the number of processes.
        valid: ``[B]`` bool, False for the samples of groups whose reward failed and were
            skipped (``run.on_reward_error`` / ``run.on_nonfinite: skip_group``).
        everyone: the batch metadata of every process (:class:`GlobalView`), once gathered.
    """

    traj: Trajectory
    prompts: list[str]
    metadata: list[dict]
    groups: torch.Tensor
    reward: RewardOutput
    step_weights: torch.Tensor
    views: list[Cond] = field(default_factory=list)
    view_rewards: list[RewardOutput] = field(default_factory=list)
    advantages: torch.Tensor | None = None
    regions: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)
    sample_weights: torch.Tensor | None = None
    iteration: int = 0
    index: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    everyone: GlobalView | None = None

    def __post_init__(self) -> None:
        self.views = self.views or [self.traj.cond]
        self.view_rewards = self.view_rewards or [self.reward]
        if self.sample_weights is None:
            self.sample_weights = torch.ones(len(self.groups))
        if self.index is None:
            self.index = torch.arange(len(self.groups))
        if self.valid is None:
            self.valid = torch.ones(len(self.groups), dtype=torch.bool)

    @staticmethod
    def build(trajs, prompts, metadata, groups, reward, step_weights,
              iteration: int = 0, index: torch.Tensor | None = None,
              valid: torch.Tensor | None = None) -> RolloutBatch:
        return RolloutBatch(cat_trajectories(trajs), prompts, metadata, groups, reward,
                            step_weights, iteration=iteration, index=index, valid=valid)
