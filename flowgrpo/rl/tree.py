"""BranchGRPO: tree rollouts with shared prefixes, and the credit of their tree nodes.

BranchGRPO (Li et al. 2025, "BranchGRPO: Stable and Efficient GRPO with Structured Branching in
Diffusion Models", arXiv:2509.06040) rolls a prompt group out as one tree instead of
``group_size`` independent chains: one root, a single trajectory until the first branch step,
where every node splits into ``factor`` children, each continuing with its own noise. The prefix
a set of leaves shares is computed once, so a group of ``factor ** len(branch_at)`` leaves costs
far fewer model rows than the chains.

Facts from the authors' code (public repository Fredreic1849/BranchGRPO at commit
``19fbb9fc92ad1857212f3b664d6e9ff80c8b3804``, file ``fastvideo/train_branchgrpo_flux.py``;
``[S]`` is the launch script ``scripts/finetune/finetune_flux_branchgrpo_8gpus.sh``):

* Branching (``run_tree_sample_step``, ``parse_split_points``): the split points are step indices
  (``--tree_split_points``, ``[S]``: ``0,3,6,9`` of 20 steps); at a split step each node takes one
  model call and draws ``num_splits = 2`` children from the same transition mean, each with its
  own noise (``flux_step_with_split``). Here: ``branch_at`` and ``factor``.
* Noise at branch points: a child's noise is scaled by ``--tree_split_noise_scale`` (argparse
  default 0.3, ``[S]`` 4.0) while its log-prob is the density of the realised sample under the
  step's Gaussian. Here: ``noise_scale`` (default 1.0: a child is a draw of the sampler itself).
* Node rewards (``compute_node_rewards_from_leaves``): a leaf's reward is its image's; an inner
  node's is the mean of the leaves below it (``--tree_prob_weighted``, a softmax over child
  log-probs, is off in ``[S]`` and not offered).
* Advantages (``compute_hierarchical_advantages_by_depth``): within one tree, the nodes of each
  depth are normalised together, ``(r - mean) / (std + 1e-8)``; a depth with one node gets 0.
  A node's depth is its step count from the root, so the transition of step ``k`` is credited
  with the advantage of the node it leads to (depth ``k + 1``).
* Training samples (``collect_all_transitions``): every edge of the tree once, shared prefixes
  included, each with the same weight.
* Pruning (the block after ``collect_all_transitions``): depth pruning drops the edges into the
  depths ``--depth_pruning`` from training (sampling and rewards unchanged), optionally sliding
  one depth shallower every ``--depth_pruning_slide_interval`` iterations until
  ``--depth_pruning_stop_depth``; width pruning (``--width_pruning_mode``) keeps among the edges
  after the last split (parent step > last split step) either the best ``width_pruning_ratio``
  of each last-split branch by advantage (mode 1) or the best and the worst halves of that share
  over the whole batch (mode 2, at least 2 kept).

How they map here: :class:`TreeRollout` (``sampler.rollout: tree``) returns the usual per-leaf
:class:`~flowgrpo.rl.rollout.Trajectory`, every leaf holding its whole root-to-leaf path (the
shared states copied), so objectives and samplers compose unchanged. The tree credit
(``train.credit: tree``, :func:`node_rewards`) recovers the nodes from the trajectory itself
(leaves of a group whose stored state after step ``k`` is equal lie in one node), gives every
trained step of a leaf the reward of its node, so the per-step, per-group normalisation of the
advantage estimators is the authors' per-depth normalisation, and weighs a step shared by ``m``
leaves ``1 / m`` (``batch.step_weights``), so every edge counts once as in the authors' code.

Deviations: the estimator's std is the population one (the project's convention, docs/design.md,
"Conventions"), the authors' ``torch.std`` the unbiased one: at a depth of ``n`` nodes the
advantages here are theirs times ``sqrt(n / (n - 1))``. Width pruning zeroes the weights of the
pruned steps (the same gradient; their forwards are still run); depth pruning drops the steps
from the trajectory, which saves their training forwards. The authors' ``pruning_step_ratio`` and
mixed ODE/SDE windows (``--mix_ode_sde_tree``, off in ``[S]``) are not offered: the step selection
chooses the trained steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

import samplers
from flowgrpo.rl.rollout import (
    ROLLOUTS,
    RolloutSpec,
    Trajectory,
    _sigma,
    model_velocity,
    step_noise,
)
from pipelines import Cond, FlowAdapter
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT

WIDTH_MODES = (0, 1, 2)


def tree_members(groups: Tensor) -> list[list[int]]:
    """The rows of each group of a chunk, in order of first appearance (rows ascending)."""
    order: dict[int, list[int]] = {}
    for row, g in enumerate(groups.tolist()):
        order.setdefault(int(g), []).append(row)
    return list(order.values())


def representatives(members: list[list[int]], factor: int, branches: int,
                    size: int) -> Tensor:
    """``[size]`` the row whose state each leaf shares after ``branches`` branch steps: the first
    leaf of its node (a node after ``b`` branches holds ``G / factor**b`` consecutive leaves)."""
    rep = torch.empty(size, dtype=torch.long)
    for rows in members:
        block = len(rows) // factor**branches
        for p, row in enumerate(rows):
            rep[row] = rows[(p // block) * block]
    return rep


@ROLLOUTS.register("tree")
class TreeRollout:
    """BranchGRPO's tree rollout (``sampler.rollout: tree``): each prompt group is one tree.

    The root is the initial noise of the group's first sample; at each step in ``branch_at``
    every node splits into ``factor`` children, so a group holds ``factor ** len(branch_at)``
    leaves. A node takes one model row per step (the rows of shared prefixes are computed once);
    a child's step noise is the chain noise of its first leaf at that step (scaled by
    ``noise_scale`` at a branch step), so the group's first leaf is exactly the chain rollout of
    its sample, and every leaf is a chain rollout given the noise of its nodes.

    Args:
        branch_at: the branch steps (step ``k`` is ``sigmas[k] -> sigmas[k+1]``); each must be
            a trained step of every sample.
        factor: children per branching node.
        noise_scale: scale of the children's noise at a branch step (the authors'
            ``tree_split_noise_scale``); 1 draws from the sampler itself.
    """

    groupwise = True  # the trainer's chunks hold whole groups

    def __init__(self, branch_at: list | tuple = (0,), factor: int = 2,
                 noise_scale: float = 1.0) -> None:
        steps = [int(k) for k in branch_at]
        if not steps or len(set(steps)) != len(steps) or min(steps) < 0:
            raise ValueError(f"sampler.rollout_params.branch_at {list(branch_at)!r} must be "
                             "distinct step indices >= 0, at least one")
        if int(factor) < 2:
            raise ValueError(f"sampler.rollout_params.factor {factor!r} must be >= 2")
        if not noise_scale > 0:
            raise ValueError(f"sampler.rollout_params.noise_scale {noise_scale!r} must be > 0")
        self.branch_at, self.factor, self.noise_scale = sorted(steps), int(factor), noise_scale

    @property
    def leaves(self) -> int:
        """Leaves per tree: the group size the tree needs."""
        return self.factor ** len(self.branch_at)

    def check(self, members: list[list[int]], sigmas: Tensor, trained: Tensor,
              spec: RolloutSpec) -> None:
        """One-line errors for a chunk the tree cannot roll out."""
        for rows in members:
            if len(rows) != self.leaves:
                raise ValueError(
                    f"train.group_size {len(rows)} must equal factor ** len(branch_at) = "
                    f"{self.factor} ** {len(self.branch_at)} = {self.leaves} for the tree "
                    "rollout: set train.group_size or sampler.rollout_params")
            if not bool((trained[rows] == trained[rows[0]]).all()):
                raise ValueError("the tree rollout needs the same trained steps for every "
                                 "sample of a group: use a step selection that selects per "
                                 "group (train.step_selection)")
        if self.branch_at[-1] >= len(sigmas) - 1:
            raise ValueError(f"sampler.rollout_params.branch_at {self.branch_at} must be below "
                             f"sampler.num_steps {len(sigmas) - 1}")
        missing = [k for k in self.branch_at if not bool((trained == k).any(1).all())]
        if missing:
            raise ValueError(f"branch steps {missing} are not trained steps of every sample: "
                             "a branch step must be stochastic; choose branch_at among the "
                             "trained steps (train.step_selection)")
        if spec.after_window != "euler":
            raise ValueError("the tree rollout keeps the step grid: set sampler.after_window: "
                             "euler")

    @torch.no_grad()
    def __call__(self, adapter: FlowAdapter, spec: RolloutSpec, cond: Cond, noise: Tensor,
                 sigmas: Tensor, trained: Tensor,
                 generator: torch.Generator | list[torch.Generator] | None = None,
                 groups: Tensor | None = None) -> Trajectory:
        """Roll the groups of ``groups`` out as trees; arguments as
        :func:`flowgrpo.rl.rollout.rollout` (``noise`` rows other than each group's first are
        not read: every leaf starts at its root)."""
        if groups is None:
            raise ValueError("the tree rollout needs the group ids of the chunk (groups)")
        device = noise.device
        trained = trained.to(device).long().sort(dim=1).values
        batch, num = trained.shape
        members = tree_members(groups.cpu())
        self.check(members, sigmas, trained, spec)
        weight = cond.tensors.get(LOGPROB_WEIGHT)
        lengths = cond.tensors.get(LATENT_LENGTH)  # samples of their own length draw at it
        at_length = {} if lengths is None else {"lengths": lengths}
        ode, dtype, space = samplers.build("ode"), spec.storage_dtype, adapter.state_space
        rep = representatives(members, self.factor, 0, batch).to(device)
        x = space.store(noise[rep], dtype)
        states, grid = [space.stored(x, dtype)], [sigmas[0]]
        log_probs = torch.zeros(batch, num, device=device)
        done = 0  # branch steps taken
        for k in range(len(sigmas) - 1):
            s, s_next = sigmas[k], sigmas[k + 1]
            branch = k in self.branch_at
            done += branch
            new = representatives(members, self.factor, done, batch).to(device)
            parents, children = rep.unique(), new.unique()  # sorted rows
            velocity = model_velocity(adapter, cond.index(parents), spec.guidance, spec.autocast)
            v_par = velocity(x[parents], _sigma(s, x[parents]))
            v = v_par[torch.searchsorted(parents, rep[children])]
            xc = x[children]  # a child's leaves still share its parent's state
            here_all = trained == k
            # every leaf draws its chain noise; a node uses its first leaf's
            drawn_all = (torch.ones(batch, dtype=torch.bool, device=device)
                         if space.random_every_step else here_all.any(1))
            here, drawn = here_all[children], drawn_all[children]
            stochastic = here.any(1)
            if bool(drawn.any()):
                eps = step_noise(x, drawn_all, generator, space, **at_length)[children]
                if branch:
                    eps = eps * self.noise_scale
                child_velocity = model_velocity(adapter, cond.index(children), spec.guidance,
                                                spec.autocast)
                tr = spec.sampler.transition(v, xc, float(s), float(s_next),
                                             velocity_fn=child_velocity)
                x_new = space.store(tr.sample(noise=eps), dtype)
                if bool(stochastic.any()):
                    lp = tr.log_prob(x_new, weight=None if weight is None else weight[children])
                    at = torch.searchsorted(children, new)
                    log_probs = torch.where(here_all, lp[at][:, None], log_probs)
                if not bool(drawn.all()):
                    euler = ode.transition(v, xc, float(s), float(s_next)).mean.to(dtype).float()
                    mask = drawn.reshape(-1, *([1] * (xc.ndim - 1)))
                    x_new = torch.where(mask, x_new, euler)
            else:
                x_new = ode.transition(v, xc, float(s), float(s_next)).mean.to(dtype).float()
            x = x_new[torch.searchsorted(children, new)]
            rep = new
            states.append(space.stored(x, dtype))
            grid.append(s_next)
        return Trajectory(torch.stack(states, 1), torch.stack(grid).float(), trained,
                          log_probs.float(), cond)


# --------------------------------------------------------------------------- credit of the nodes
def node_ids(latents: Tensor, groups: Tensor, steps: Tensor) -> Tensor:
    """``[B, J]`` the node each leaf's trained step ``steps[b, j]`` leads to: the first row of
    its group whose stored state after the step equals the leaf's (leaves of one node hold
    copies of one state)."""
    out = torch.empty(steps.shape, dtype=torch.long)
    flat = latents.flatten(2)
    steps = steps.cpu()
    for rows in tree_members(groups.cpu()):
        for j in range(steps.shape[1]):
            ks = steps[rows, j].tolist()
            for r, row in enumerate(rows):
                k = ks[r]
                out[row, j] = next(rows[q] for q in range(r + 1) if ks[q] == k and
                                   torch.equal(flat[rows[q], k + 1], flat[row, k + 1]))
    return out


def last_branch(nodes: Tensor, steps: Tensor, groups: Tensor) -> int:
    """The last trained step at which the number of nodes grows (-1: none), from the roots
    (one per group) on."""
    before, last = len(groups.unique()), -1
    for j in range(nodes.shape[1]):
        n = len(nodes[:, j].unique())
        if n > before:
            last = int(steps[0, j])
        before = n
    return last


def node_rewards(scores: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """Per trained step of each leaf, the reward of its node (the mean of the leaves below
    it) and the number of leaves sharing the step.

    Args:
        scores: ``[B]`` leaf rewards.
        nodes: ``[B, J]`` node ids (:func:`node_ids`; ids are rows of the batch).

    Returns:
        ``([B, J]`` node rewards, ``[B, J]`` leaf counts``)``.
    """
    scores = scores.float().cpu()
    nodes = nodes.cpu()
    reward = torch.empty(nodes.shape)
    count = torch.empty(nodes.shape)
    for j in range(nodes.shape[1]):
        col = nodes[:, j]
        for node in col.unique().tolist():
            rows = col == node
            reward[rows, j] = scores[rows].mean()
            count[rows, j] = float(rows.sum())
    return reward, count


def depth_advantages(reward: Tensor, groups: Tensor, eps: float = 1e-4) -> Tensor:
    """``[B, J]`` node rewards normalised per step (depth) within each group, population std;
    a constant column of a group gets 0 (what the advantage estimator then does)."""
    out = torch.zeros_like(reward)
    for rows in tree_members(groups.cpu()):
        r = reward[rows]
        centred = r - r.mean(0, keepdim=True)
        std = r.std(0, unbiased=False, keepdim=True)
        out[rows] = torch.where(std > 0, centred / (std + eps), torch.zeros_like(r))
    return out


def width_keep(adv: Tensor, steps: Tensor, last_branch: int, mode: int,
               ratio: float) -> Tensor:
    """``[B, J]`` bool, the trained steps width pruning keeps (the authors' modes): only steps
    after the last branch step (``steps > last_branch``) are candidates. Mode 1 keeps the best
    ``max(1, int(n * ratio))`` by advantage of each leaf's ``n`` candidates (after the last
    branch every leaf is its own branch), mode 2 the best ``keep // 2`` and the worst
    ``keep - keep // 2`` of all candidates of the batch, ``keep = max(2, int(n * ratio))``."""
    keep = torch.ones(steps.shape, dtype=torch.bool)
    late = steps.cpu() > last_branch
    if mode == 0 or not bool(late.any()):
        return keep
    keep[late] = False
    if mode == 1:
        for b in range(len(steps)):
            cols = late[b].nonzero().flatten()
            n = max(1, int(len(cols) * ratio))
            best = adv[b, cols].argsort(descending=True, stable=True)[:n]
            keep[b, cols[best]] = True
        return keep
    cand = late.nonzero()
    values = adv[cand[:, 0], cand[:, 1]]
    n = min(max(2, int(len(cand) * ratio)), len(cand))
    order = values.argsort(descending=True, stable=True)
    chosen = torch.cat([order[:n // 2], order[len(order) - (n - n // 2):]])
    keep[cand[chosen, 0], cand[chosen, 1]] = True
    return keep


def pruned_steps(steps: list[int], every: int, stop: int | None, iteration: int) -> list[int]:
    """The steps depth pruning drops at ``iteration``: ``steps``, or with ``every`` > 0 shifted
    one step earlier every ``every`` iterations while the earliest stays >= ``stop`` (the
    authors' sliding window; their depth ``d`` is step ``d - 1`` here)."""
    if not steps or every <= 0:
        return sorted(steps)
    first = min(steps)
    shift = min(iteration // every, max(0, first - (0 if stop is None else stop)))
    return sorted(k - shift for k in steps)


def drop_steps(batch: Any, drop: list[int]) -> None:
    """Remove the trained steps ``drop`` from ``batch`` (trajectory, step weights): their
    training forwards are saved. Every sample must train the same number of them."""
    if not drop:
        return
    traj = batch.traj
    mask = torch.isin(traj.trained, torch.tensor(drop, device=traj.trained.device))
    counts = mask.sum(1)
    if not bool((counts == counts[0]).all()):
        raise ValueError("train.credit_params.prune_steps must drop the same number of trained "
                         "steps of every sample; pick steps every sample trains")
    keep = ~mask
    rows, cols = len(mask), int(keep[0].sum())
    if cols == 0:
        raise ValueError(f"train.credit_params.prune_steps {drop} drops every trained step; "
                         "keep at least one")
    batch.traj = dataclasses.replace(traj, trained=traj.trained[keep].reshape(rows, cols),
                                     log_probs=traj.log_probs[keep.to(traj.log_probs.device)]
                                     .reshape(rows, cols))
    batch.step_weights = batch.step_weights[keep.to(batch.step_weights.device)].reshape(rows,
                                                                                      cols)

