"""Per-step credit assignment for trajectories scored at every trained step.

TurningPoint-GRPO (TP-GRPO; Tong et al. 2026, "Alleviating Sparse Rewards by Modeling Step-Wise
and Long-Term Sampling Effects in Flow-Based GRPO", arXiv:2602.06422) replaces the one outcome
reward that Flow-GRPO copies to every denoising step by a reward per trained step. For a sample
whose ``K`` trained (SDE) steps are taken from initial noise ``x_T``, the rollout scores ``K + 1``
images, ``step_rewards[b] = [R_0, R_1, ..., R_K]`` (shape ``[B, K + 1]``):

* ``R_0`` is the reward of a pure-ODE rollout from the same noise (no SDE step at all),
* ``R_k`` the reward after the first ``k`` SDE steps followed by an ODE completion,
* ``R_K`` the reward of the stochastic trajectory itself (all ``K`` SDE steps).

Step ``k`` (0-based, shape ``[B, K]``) is credited with its incremental reward
``d_k = R_{k+1} - R_k``, except at *turning points*: steps that flip the local reward trend back
towards the trajectory's overall trend ``R_K - R_0`` and after which the reward keeps moving that
way. A turning point receives the aggregated long-term reward ``R_K - R_k`` instead, and positive
and negative turning points are balanced in number. :func:`turning_points` implements the rule;
:class:`TurningPointCredit` (``train.credit: turning_point``) runs the completions and scores them;
the advantages are then normalised per trained step (one column of ``[B, K]`` at a time), which
:func:`flowgrpo.rl.advantages.compute_advantages` already does for a ``[B, K]`` reward. Cost: one
extra ODE completion and reward call per trained step per sample (``K - 1`` completions plus the
pure-ODE rollout, since ``R_K`` is the trajectory's own reward).

The module holds the credit registry (``train.credit``): a credit scheme turns a scored rollout
batch into the rewards ``[B, V, J, P]`` that advantages come from; ``outcome`` (one reward per
sample, view or region, the default), ``turning_point`` and ``tree`` (BranchGRPO's per-node
credit of tree rollouts, :mod:`flowgrpo.rl.tree`) are registered.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowgrpo.registry import Registry
from flowgrpo.rl import tree
from flowgrpo.rl.rollout import SOLVERS, solve
from flowgrpo.rl.session import ModelSession, Score
from samplers import CONTINUOUS, StateSpace

__all__ = ["turning_points"]


def turning_points(
    step_rewards: Tensor,
    *,
    first_step: bool = True,
    consistency_filter: bool = True,
    balance: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-step rewards of TurningPoint-GRPO and the turning-point mask.

    Args:
        step_rewards: ``[B, K + 1]`` real tensor, columns ``R_0 .. R_K`` (see the module
            docstring): ``R_0`` the pure-ODE reward, ``R_k`` the reward after ``k`` SDE steps and an
            ODE completion, ``R_K`` the final reward of the stochastic trajectory. ``K >= 1``.
        first_step: the first-step rule (rule 5); the authors' ``apply_first_step_bonus``.
        consistency_filter: the consistency filters (rule 6); the authors'
            ``select_first_step_only_from_consistent_trajectory`` and
            ``select_inter_step_only_from_consistent_trajectory``, both set by one switch.
        balance: balance positive and negative turning points (rule 7); the authors'
            ``use_balanced_bonus``. The pool is the whole ``[B, K]`` input: pass one sampling batch
            (the authors balance within each per-device sampling batch, across all its steps).

    Returns:
        ``(step_reward, is_turning)``: ``[B, K]`` float32 reward of each trained step and the
        ``[B, K]`` bool mask of turning points kept after balancing.

    Raises:
        TypeError: if ``step_rewards`` is not a tensor.
        ValueError: if it is not 2-D or has fewer than two columns.

    Rules (sources: public repository YunzeTong/TurningPoint-GRPO at commit ``f9f6ff4``; ``[T]`` is
    ``scripts/my_train_sd3_fast_with_op3.py``, function ``main``, block "Process Reward
    Computation"; ``[P]`` is ``flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_fast_my.py``;
    ``[L]`` is the launch script ``scripts/single_node/common_op3.sh``, identical flags in
    ``scripts/multi_node/common_op3.sh``; defaults here are the ``[L]`` flags):

    1. Reward sequence. ``R_0`` is the pure-ODE rollout from the same generator (``[P]``
       ``pipeline_ode_sampling``: ``noise_level=0``, ``sde_window_size=0``); ``R_k`` for
       ``k < K`` ODE-completes the latent stored after the ``k``-th SDE window step; ``R_K`` reuses
       the final image, since the last SDE state completed by ODE is the trajectory itself (``[P]``
       ``pipeline_mixed_sampling_with_intermediate_ode``, end). ``[T]`` builds
       ``[R_ode, R_1, ..., R_n]`` sorted by ``sde_steps_count``.
    2. Incremental reward ``d_k = R_{k+1} - R_k`` (``[T]`` ``d_list``).
    3. Trend agreement ``s_k = sign(d_k) * sign(R_K - R_0)`` with ``sign(0) = 0`` (``[T]``
       ``s_list``, ``delta_global = sde_reward - ode_reward``, ``torch.sign``).
    4. Step ``k >= 1`` is a turning point when ``s_{k-1} < 0`` and ``s_k > 0``, both strict
       (``[T]`` indicator loop, ``t > 0`` branch). A zero increment (``s = 0``) neither starts nor
       completes a flip; if ``R_K == R_0`` every ``s_k`` is 0 and no step ``k >= 1`` qualifies.
       The authors' options ``indicator_wo_delta_global_constraint`` and
       ``select_only_positive_intermediate_step`` are off (``[L]``; the latter from
       ``config/my_grpo.py``, ``pickscore_sd3_fast_op3``) and not offered here.
    5. First step (``k = 0``, no ``s_{-1}``): with the consistency filter it is a turning point
       when ``sign(d_0) * sign(R_K - R_1) > 0``, i.e. the first step and everything after it move
       the same way (this does not read ``R_K - R_0``; it implies ``sign(R_K - R_0) = sign(d_0)``);
       without the filter when ``s_0 > 0``; with ``first_step=False`` never (``[T]`` ``t == 0``
       branch). So a monotone trajectory has its first step as its one turning point.
    6. Consistency filter for ``k >= 1``: keep a turning point only if
       ``sign(d_k) * sign(R_K - R_{k+1}) > 0``, i.e. the reward keeps moving the same way after
       the step (``[T]`` ``consistent_judge``). Hence the last step ``k = K - 1``
       (``R_K - R_K = 0``) is never a turning point while the filter is on, and neither is the first
       step when ``K = 1``.
    7. Balancing (``[T]`` "Apply balanced bonus" block): over all turning points of the input,
       the ranking key is ``R_K - R_0`` of the point's trajectory (``delta_global``; not the
       long-term reward of rule 8). Split the points by the key's sign; only if both signs occur,
       keep ``min(#positive, #negative)`` of each sign, the largest ``|R_K - R_0|`` first; the
       smaller side is kept whole. If all points share one sign, all are kept. A turning point that
       is not kept is an ordinary step (rule 9).
    8. A kept turning point receives ``R_K - R_k`` in place of ``d_k`` (``[L]``:
       ``take_delta_global_as_main=false``, ``use_sde_minus_rt=true``, ``eta=1.0``,
       ``drop_original_reward_when_having_bonus=true``; ``[T]`` "Second pass"). The authors drop
       ``d_k`` only where the bonus is non-zero, so a turning point with ``R_K == R_k`` keeps
       ``d_k``; that can only happen with ``consistency_filter=False`` (with it the signs of rules
       5/6 make ``R_K - R_k`` non-zero). ``propagate_bonus_to_future_steps`` is off (``[L]``).
    9. Every other step receives ``d_k``; a flat sequence gets zeros everywhere.

    Deviations from the authors' code:

    * Tie-breaking in rule 7: they use ``torch.topk``, whose order among equal keys is not
      specified; ties are common because all turning points of one trajectory share ``R_K - R_0``.
      Here equal keys are kept in row-major order (lower batch index first, then earlier step), so
      the result is deterministic.
    * ``eta`` (fixed at 1.0 by ``[L]``) and the warm-up ``turn_on_bonus_global_step`` (0) are not
      options: the first is a plain scale of rule 8, the second is the caller's schedule.
    * Arithmetic is in float32 (float64 if the input is float64); they use float32 rewards.
    """
    if not isinstance(step_rewards, Tensor):
        raise TypeError(f"step_rewards must be a torch.Tensor, got {type(step_rewards).__name__}")
    if step_rewards.ndim != 2:
        raise ValueError(f"step_rewards must be [B, K+1], got shape {tuple(step_rewards.shape)}")
    if step_rewards.shape[1] < 2:
        raise ValueError(f"step_rewards needs >= 2 columns (R_0..R_K), got {step_rewards.shape[1]}")

    dtype = torch.float64 if step_rewards.dtype == torch.float64 else torch.float32
    rewards = step_rewards.detach().to(dtype)
    final = rewards[:, -1:]  # R_K, [B, 1]
    incr = rewards[:, 1:] - rewards[:, :-1]  # d_k, [B, K]
    long_term = final - rewards[:, :-1]  # R_K - R_k, [B, K]
    overall = final - rewards[:, :1]  # R_K - R_0, [B, 1]
    agree = torch.sign(incr) * torch.sign(overall)  # s_k, [B, K]
    consistent = torch.sign(incr) * torch.sign(final - rewards[:, 1:]) > 0  # [B, K]

    turning = torch.zeros_like(incr, dtype=torch.bool)
    turning[:, 1:] = (agree[:, :-1] < 0) & (agree[:, 1:] > 0)
    if consistency_filter:
        turning[:, 1:] &= consistent[:, 1:]
    if first_step:
        turning[:, 0] = consistent[:, 0] if consistency_filter else agree[:, 0] > 0
    if balance:
        turning = _balance(turning, overall.expand_as(incr))

    step_reward = torch.where(turning & (long_term != 0), long_term, incr)
    return step_reward.to(torch.float32), turning


def _balance(turning: Tensor, key: Tensor) -> Tensor:
    """Rule 7: equal numbers of positive- and negative-key turning points, largest ``|key|`` kept.

    ``turning`` ``[B, K]`` bool, ``key`` ``[B, K]`` float; returns the kept ``[B, K]`` mask.
    """
    flat, flat_key = turning.reshape(-1), key.reshape(-1)
    positive = flat & (flat_key > 0)
    negative = flat & (flat_key < 0)
    keep = min(int(positive.sum()), int(negative.sum()))
    if keep == 0:
        return turning
    kept = _largest(positive, flat_key, keep) | _largest(negative, flat_key, keep)
    return kept.reshape(turning.shape)


def _largest(members: Tensor, key: Tensor, keep: int) -> Tensor:
    """The ``keep`` members (``[N]`` bool) with the largest ``|key|``; ties by lower index."""
    index = members.nonzero().squeeze(1)  # ascending flat order
    if index.numel() > keep:
        order = torch.sort(key[index].abs(), descending=True, stable=True).indices
        index = index[order[:keep]]
    kept = torch.zeros_like(members)
    kept[index] = True
    return kept


# --------------------------------------------------------------------------- the credit registry
CREDITS: Registry[type[Credit]] = Registry("credit")


@dataclass
class Signal:
    """The rewards training normalises into advantages, for one process's batch.

    Attributes:
        scores: ``[B, V, J, P]`` rewards per view, trained step and region (size-1 axes are
            broadcast; each column is normalised within its group).
        components: per-component rewards of the same shape (a reward mix), or None.
        regions: ``[P, ...]`` region membership maps on the latent grid, or None.
    """

    scores: torch.Tensor
    components: dict[str, torch.Tensor] | None = None
    regions: torch.Tensor | None = None


class Credit:
    """Base class: turns a scored rollout batch into the rewards that advantages come from.

    Subclasses take their parameters as keyword arguments and implement :meth:`rewards`; they
    may run extra model calls through ``session`` (a :class:`~flowgrpo.rl.session.ModelSession`)
    and extra reward calls through ``score(media, prompts, metadata) -> RewardOutput``.
    """

    # the state space it credits (samplers.spaces); None: either. The config refuses another.
    state_space: ClassVar[StateSpace | None] = None

    def rewards(self, session: ModelSession, score: Score, batch: Any) -> Signal:
        raise NotImplementedError


@CREDITS.register("outcome")
class OutcomeCredit(Credit):
    """One reward per sample (and view), credited to every trained step: GRPO's outcome
    reward. A region reward (``regions`` ``[B, *R]``) gives one reward per region instead, each
    credited to the region's latent positions (SpatialFlow-GRPO)."""

    def rewards(self, session, score, batch):
        outs = batch.view_rewards
        if outs[0].regions is not None:
            grid = outs[0].regions.float()
            cells = grid[0].numel()
            onehot = torch.eye(cells).reshape(cells, *grid.shape[1:]).to(session.device)
            maps = session.adapter.position_weights(onehot, batch.traj.latents[:1, 0].float())
            return Signal(grid.reshape(len(grid), 1, 1, cells), None, maps)
        def per_view(values: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack([v.float() for v in values], 1)[:, :, None, None]

        components = None
        if outs[0].components:
            components = {k: per_view([o.components[k] for o in outs]) for k in outs[0].components}
        return Signal(per_view([o.scores for o in outs]), components)


@CREDITS.register("turning_point")
class TurningPointCredit(Credit):
    """TurningPoint-GRPO: per-step rewards from deterministic completions (see
    :func:`turning_points`).

    ``R_0`` is the reward of the deterministic completion from the latent before the first
    trained step (the steps before it are deterministic, so this is the pure-ODE sample of the
    same initial noise), ``R_k`` (``0 < k < K``) that of the completion after the first ``k``
    trained steps, and ``R_K`` the trajectory's own reward. Completions reuse
    :func:`flowgrpo.rl.rollout.solve`, batched over every sample that starts at the same step, and
    cost ``K`` completions and ``K`` reward calls per sample (counted in ``calls/nograd``).

    Args:
        solver: ``euler`` or ``dpm2`` for the completions.
        **rules: keyword options of :func:`turning_points`.
    """

    state_space = CONTINUOUS  # its completions solve the probability-flow ODE

    def __init__(self, solver: str = "euler", **rules: Any) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
        inspect.signature(turning_points).bind(torch.zeros(1, 2), **rules)
        self.solver, self.rules = solver, rules

    def rewards(self, session, score, batch):
        traj = batch.traj
        if traj.num_trained == 0:
            raise ValueError("turning_point credit needs at least one trained step per sample")
        # the full schedule: with a dpm2 tail the trajectory's own grid ends in one long step
        sigmas = session.schedule()
        # R_0 completes from before the first trained step, R_j from after the j-th
        starts = torch.cat([traj.trained[:, :1], traj.trained[:, :-1] + 1], 1)
        step_rewards = [self.completion_rewards(session, score, batch, sigmas,
                                                starts[:, j])
                        for j in range(traj.num_trained)]
        step_rewards.append(batch.reward.scores.float().cpu())
        step_reward, turning = turning_points(torch.stack(step_rewards, 1), **self.rules)
        batch.info["credit/turning_frac"] = float(turning.float().mean())
        return Signal(step_reward[:, None, :, None])

    @torch.no_grad()
    def completion_rewards(self, session: ModelSession, score: Score, batch, sigmas: torch.Tensor,
                           start: torch.Tensor) -> torch.Tensor:
        """``[B]`` rewards of the deterministic completions along ``sigmas`` (the full
        schedule) from latent index ``start [B]``."""
        traj = batch.traj
        final = torch.empty_like(traj.latents[:, -1], dtype=torch.float32)
        for k in sorted(set(start.tolist())):
            rows = (start == k).nonzero().flatten().to(traj.latents.device)
            final[rows] = solve(session.adapter, traj.latents[rows, k].float(), sigmas[k:],
                                traj.cond.index(rows), session.guidance, self.solver,
                                session.autocast)
        media = session.decode(final)
        return score(media, batch.prompts, batch.metadata).scores.float().cpu()


def build(name: str, **params: Any) -> Credit:
    """The credit scheme registered as ``name`` with its parameters."""
    return CREDITS.build(name, **params)


@CREDITS.register("tree")
class TreeCredit(Credit):
    """BranchGRPO's credit of tree rollouts (``sampler.rollout: tree``; see
    :mod:`flowgrpo.rl.tree`): each trained step of a leaf gets the reward of the tree node it
    leads to, the mean reward of the leaves below that node, so the per-step normalisation within
    the group is the authors' per-depth normalisation within the tree; a step that ``m`` leaves
    share weighs ``1 / m`` (``batch.step_weights``, scaled to mean 1), so every tree edge counts
    once and the loss is the mean over the edges, as in the authors' code. On chain
    rollouts every node is one leaf and this is the outcome credit.

    Args:
        prune_steps: depth pruning, the trained steps dropped from training (the authors'
            ``depth_pruning``: their depth ``d`` is step ``d - 1``); their forwards are saved.
        prune_slide: slide the pruned steps one step earlier every ``prune_slide`` iterations
            (0: fixed; the authors' ``depth_pruning_slide_interval``) while the earliest stays
            at or after ``prune_stop`` (their ``depth_pruning_stop_depth`` minus 1; None: 0).
        width: width pruning after the last branch step: 0 off, 1 the best ``width_ratio`` of
            each leaf's steps by advantage, 2 the best and the worst of the batch's (the
            authors' ``width_pruning_mode``); pruned steps get weight 0.
        width_ratio: the share width pruning keeps (the authors' ``width_pruning_ratio``).
    """

    def __init__(self, prune_steps: list | tuple = (), prune_slide: int = 0,
                 prune_stop: int | None = None, width: int = 0,
                 width_ratio: float = 0.5) -> None:
        if width not in tree.WIDTH_MODES:
            raise ValueError(f"train.credit_params.width {width!r} must be one of "
                             f"{', '.join(map(str, tree.WIDTH_MODES))}")
        if not 0 < width_ratio <= 1:
            raise ValueError(f"train.credit_params.width_ratio {width_ratio!r} must be in (0, 1]")
        if prune_slide < 0:
            raise ValueError(f"train.credit_params.prune_slide {prune_slide!r} must be >= 0")
        self.prune_steps = [int(k) for k in prune_steps]
        self.prune_slide, self.prune_stop = int(prune_slide), prune_stop
        self.width, self.width_ratio = int(width), float(width_ratio)

    def rewards(self, session, score, batch):
        drop = tree.pruned_steps(self.prune_steps, self.prune_slide, self.prune_stop,
                                 batch.iteration)
        tree.drop_steps(batch, drop)
        traj = batch.traj
        if traj.num_trained == 0:
            raise ValueError("tree credit needs at least one trained step per sample")
        nodes = tree.node_ids(traj.latents, batch.groups, traj.trained)
        reward, count = tree.node_rewards(batch.reward.scores, nodes)
        # every edge once; scaled to mean 1, so the loss is the mean over the tree's edges
        weights = 1.0 / count
        weights = weights * weights.numel() / weights.sum()
        if self.width:
            adv = tree.depth_advantages(reward, batch.groups)
            last = tree.last_branch(nodes, traj.trained.cpu(), batch.groups.cpu())
            keep = tree.width_keep(adv, traj.trained, last, self.width, self.width_ratio)
            weights = weights * keep.float()
            batch.info["credit/width_kept_frac"] = float(keep.float().mean())
        batch.step_weights = batch.step_weights * weights.to(batch.step_weights.device)
        batch.info["credit/tree_nodes"] = float(sum(len(nodes[:, j].unique())
                                                    for j in range(nodes.shape[1])))
        return Signal(reward[:, None, :, None])


from flowgrpo.rl import tree as _tree  # noqa: E402,F401  (registers the tree credit)
