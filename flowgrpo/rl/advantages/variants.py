"""Advantage estimators beyond GRPO's: focal, A-GRAE, dual-anchor and reward-confidence
correction, registered in :data:`flowgrpo.rl.advantages.ADVANTAGES` (see that module for the shared
shapes and the run-time inputs ``state``, ``progress`` and ``confidence``).

``p_g`` is a group's success rate: its mean reward normalised to ``[0, 1]`` (see
:func:`success_rate`), exactly the fraction of successes for binary rewards; every estimator
works per column, so per-step rewards ``[B, J]`` are served too.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence

import torch
from torch import Tensor

from flowgrpo.rl.advantages.base import ADVANTAGES, _group_stats, _real, _validated
from flowgrpo.validation import one_of


def _stats(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(rewards, mean, std, constant, centred)``, each ``[B, *E]``, as :func:`_centred`."""
    rewards, groups = _validated(rewards, groups)
    mean, std, constant = _group_stats(rewards, groups)
    centred = torch.where(constant, torch.zeros_like(rewards), rewards - mean)
    return rewards, mean, std, constant, centred


def _group_mean(values: Tensor, groups: Tensor) -> Tensor:
    """Per-sample mean of ``values`` ``[B, *E]`` over the sample's group, column by column."""
    flat = values.reshape(values.shape[0], -1)
    _, inverse = torch.unique(groups.to(flat.device), return_inverse=True)
    zeros = torch.zeros(int(inverse.max()) + 1, flat.shape[1], device=flat.device)
    count = zeros.index_add(0, inverse, torch.ones_like(flat))
    return (zeros.index_add(0, inverse, flat) / count)[inverse].reshape(values.shape)


def _reward_range(reward_range: object) -> tuple[float, float]:
    if isinstance(reward_range, (str, bytes)) or not isinstance(reward_range, Sequence) \
            or len(reward_range) != 2:
        raise TypeError(f"reward_range must be [low, high] (or None), got {reward_range!r}")
    low = _real("reward_range[0]", reward_range[0])
    high = _real("reward_range[1]", reward_range[1])
    if not low < high:
        raise ValueError(f"reward_range must have low < high, got {list(reward_range)}")
    return low, high


def success_rate(rewards: Tensor, mean: Tensor, reward_range: object = None) -> Tensor:
    """A group's success rate ``p_g in [0, 1]``: its mean reward, normalised.

    The papers behind ``focal`` and ``a_grae`` define ``p_g`` for binary (0/1) rewards as the
    group's fraction of successes. Our continuous generalisation is the group mean rescaled to
    ``[0, 1]``, column by column: ``p_g = (mean_g - low) / (high - low)`` with ``[low, high]`` the
    given ``reward_range`` (rewards outside it are an error), or by default the column's batch
    minimum and maximum (a column constant over the batch gets ``p = 0``; its advantages are 0
    anyway). Both give exactly the fraction of successes for 0/1 rewards (a batch of binary
    rewards with a non-constant group holds both 0 and 1). A non-constant group's ``p_g`` is
    strictly inside ``(0, 1)``.

    Args:
        rewards: ``[B, *E]`` float rewards; mean: ``[B, *E]`` each sample's group mean.
        reward_range: ``None`` or ``[low, high]``.

    Returns:
        ``[B, *E]`` success rate of each sample's group.
    """
    if reward_range is None:
        low = rewards.amin(0, keepdim=True)
        high = rewards.amax(0, keepdim=True)
    else:
        lo, hi = _reward_range(reward_range)
        if bool((rewards < lo).any()) or bool((rewards > hi).any()):
            raise ValueError(f"rewards span [{float(rewards.min()):g}, {float(rewards.max()):g}],"
                             f" outside reward_range [{lo:g}, {hi:g}]")
        low = torch.full_like(rewards[:1], lo)
        high = torch.full_like(rewards[:1], hi)
    span = high - low
    rate = (mean - low) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, rate, torch.zeros_like(rate)).clamp(0.0, 1.0)


@ADVANTAGES.register("focal")
def focal_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4, *, gamma: float = 1.0,
                     reward_range: object = None) -> Tensor:
    """F-GRPO focal weighting: ``A_i = (1 - p_g)^gamma * (r_i - mean_g) / (std_g + eps)``.

    Source: Plyusov et al. 2026, "F-GRPO: Don't Let Your Policy Learn the Obvious and Forget the
    Rare" (arXiv:2602.06717, Sec. 4): a per-prompt scalar ``g(x) = (1 - mu_pos(x))^gamma``,
    inspired by the focal loss, multiplies the group-relative advantage so that high-success
    prompts, where small groups concentrate mass on already-likely solutions, update less.
    ``mu_pos`` is the group's empirical success rate for binary rewards; for continuous rewards
    we use the normalised group mean :func:`success_rate` (our generalisation).

    Args:
        rewards, groups, eps: as :func:`group_advantages`; every column is weighted on its own.
        gamma: focusing exponent, ``>= 0`` (0: plain ``group``). Default 1.0 is our choice; the
            paper treats it as a hyper-parameter.
        reward_range: ``[low, high]`` of the reward for ``p_g`` (default: the batch's range).

    Returns:
        Advantages shaped like ``rewards``; exactly 0 where a group's column is constant.
    """
    gamma = _real("gamma", gamma, low=0.0)
    rewards, mean, std, _, centred = _stats(rewards, groups)
    rate = success_rate(rewards, mean, reward_range)
    return centred / (std + eps) * (1.0 - rate).pow(gamma)


A_GRAE_SCHEDULES = ("progress", "accuracy")


@ADVANTAGES.register("a_grae")
def a_grae_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4, *,
                      progress: float = 0.0, schedule: str = "progress", alpha: float = 1.0,
                      reward_range: object = None) -> Tensor:
    """A-GRAE: asymmetric, difficulty-curriculum reweighting of the GRPO advantage.

    Source: Yu et al. 2026, "Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with
    Exploration and Difficulty Adaptation" (arXiv:2602.05548); formula as in the authors' code,
    ``compute_grpo_outcome_advantage`` in ``verl/trainer/ppo/core_algos.py`` of
    github.com/Yu7-code/A-GRAE. With ``z`` the GRPO advantage, ``p_g`` the group's success rate,
    ``pbar`` the batch's mean success rate and ``c in [0, 1]`` the curriculum coefficient::

        easy = z / (2 (1 - sqrt(p_g) + eps))        # largest for easy (high-p) groups
        hard = z / (2 (sqrt(p_g) + eps))            # largest for hard (low-p) groups
        A    = (1 - c) easy + c hard                # easy -> hard as c grows
        A    = A * min(1, pbar / alpha)  where A > 0

    The last line suppresses the advantages of above-mean (correct) samples, the more so while
    the batch success rate is low, which the paper finds encourages exploration. The authors'
    code drives the curriculum by ``c = pbar`` (``schedule="accuracy"``); following the requested
    design we default to an explicit schedule, ``c = progress`` (fraction of training done), so
    the focus moves from easy to hard prompts over the run whatever the reward's scale. The
    attenuation always follows ``pbar``. Binary rewards as in the paper; continuous rewards use
    the normalised group mean :func:`success_rate` (our generalisation; with the default
    batch-range normalisation ``pbar`` measures the batch, not training, so pass
    ``reward_range`` to make it track competence). Easy groups with ``p_g`` near 1 get large
    weights (as in the reference); ``adv_clip`` bounds them.

    Args:
        rewards, groups, eps: as :func:`group_advantages`; every column is handled on its own.
        progress: fraction of training done, in ``[0, 1]`` (supplied by the trainer).
        schedule: ``progress`` (``c = progress``) or ``accuracy`` (``c = pbar``, the reference).
        alpha: positive-advantage attenuation scale, ``> 0`` (reference: 1 for math, 0.5 for
            geometry/medical).
        reward_range: ``[low, high]`` of the reward for ``p_g`` (default: the batch's range).

    Returns:
        Advantages shaped like ``rewards``; exactly 0 where a group's column is constant.
    """
    progress = _real("progress", progress, low=0.0, high=1.0)
    schedule = one_of("schedule", schedule, A_GRAE_SCHEDULES)
    alpha = _real("alpha", alpha, low=0.0, low_open=True)
    rewards, mean, std, _, centred = _stats(rewards, groups)
    z = centred / (std + eps)
    rate = success_rate(rewards, mean, reward_range)
    batch_rate = rate.mean(0, keepdim=True)
    root = rate.sqrt()
    easy = 0.5 * z / (1.0 - root + eps)
    hard = 0.5 * z / (root + eps)
    c = batch_rate if schedule == "accuracy" else torch.full_like(batch_rate, progress)
    adv = (1.0 - c) * easy + c * hard
    attenuation = (batch_rate / alpha).clamp(max=1.0)
    return torch.where(adv > 0, adv * attenuation, adv)


def _state_tensor(state: Mapping, key: str, like: Tensor) -> Tensor:
    if key not in state:
        raise ValueError(f"state has count {state['count']} but no {key!r}; start from an empty "
                         f"state or give both 'baseline' and 'scale'")
    value = torch.tensor(state[key], dtype=torch.float32, device=like.device)
    if value.shape != like.shape:
        raise ValueError(f"state[{key!r}] has shape {tuple(value.shape)} but the rewards' columns "
                         f"have {tuple(like.shape)}; keep one state per reward shape")
    return value


@ADVANTAGES.register("dual_anchor")
def dual_anchor_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4, *,
                           state: MutableMapping | None = None, alpha: float = 0.5,
                           decay: float = 0.9) -> Tensor:
    """Dual-anchor advantages: the group anchor plus a running global one.

    ``A_i = (r_i - mean_g) / (std_g + eps) + alpha * (r_i - b) / (s + eps)`` with ``b`` and ``s``
    exponential moving averages (decay ``decay``) of past batches' mean and population std, per
    column.

    Source: Salmani-Zarchi et al. 2026, "MDP-GRPO: Stabilized Group Relative Policy Optimization
    for Multi-Constraint Instruction Following" (arXiv:2606.06058, ACL 2026): its dual-anchor
    advantages add a second, non-group anchor so that homogeneous groups (all rewards equal,
    where z-scoring gives exactly 0: "zero-variance collapse") and uniformly good or bad groups
    ("mean-centering blindness") still carry a signal; the authors' ``training/train.py``
    (github.com/m-salmani78/MDP-GRPO) exposes it as ``dual_anchor_alpha``. The public code does
    not contain the anchor's formula, so the second anchor here is the requested running global
    baseline (our design), scaled by the running std to stay unit-free. A constant group scores
    ``alpha (r - b) / (s + eps)``: positive when it beats recent batches, negative when it trails.

    State: ``state`` (a JSON-serialisable dict the trainer keeps and checkpoints) holds
    ``baseline`` and ``scale`` (a float for ``[B]`` rewards, nested lists for ``[B, *E]``) and
    ``count`` (batches seen). The anchor uses past batches only: the first call (empty state) or
    ``state=None`` gives exactly the ``group`` advantages; each call then folds this batch's mean
    and std into the state (the first batch initialises it). All processes see the same gathered
    rewards, so their states stay equal. With ``normalize_then_sum``,
    :func:`compute_advantages` keeps one sub-dict per reward name.

    Args:
        rewards, groups, eps: as :func:`group_advantages`; every column has its own anchor.
        state: the mutable state dict, updated in place (``None``: no global anchor).
        alpha: weight of the global anchor, ``>= 0``; default 0.5 (our choice).
        decay: EMA decay in ``[0, 1)``; default 0.9 (a ~10-batch memory).

    Returns:
        Advantages shaped like ``rewards``.
    """
    alpha = _real("alpha", alpha, low=0.0)
    decay = _real("decay", decay, low=0.0, high=1.0, high_open=True)
    if state is not None and not isinstance(state, MutableMapping):
        raise TypeError(f"state must be a dict (or None), got {type(state).__name__}")
    rewards, _, std, _, centred = _stats(rewards, groups)
    adv = centred / (std + eps)
    if state is None:
        return adv
    batch_mean = rewards.mean(0)
    batch_std = rewards.std(0, correction=0)
    count = int(state.get("count", 0))
    if count > 0:
        baseline = _state_tensor(state, "baseline", batch_mean)
        scale = _state_tensor(state, "scale", batch_mean)
        adv = adv + alpha * (rewards - baseline) / (scale + eps)
        batch_mean = decay * baseline + (1.0 - decay) * batch_mean
        batch_std = decay * scale + (1.0 - decay) * batch_std
    state["baseline"] = batch_mean.tolist()
    state["scale"] = batch_std.tolist()
    state["count"] = count + 1
    return adv


@ADVANTAGES.register("rcc")
def rcc_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4, *,
                   confidence: Tensor | None = None, coef: float = 2.0) -> Tensor:
    """Reward-Confidence Correction of the group baseline.

    ``A_i = (r_i - b_g) / (std_g + eps)`` with ``b_g = mean_g(r) + coef * Cov_g(r, c)``, the
    covariance taken within the group (population, per column) between the reward and the
    policy's confidence ``c``.

    Source: Li, Lan & Qi 2026, "When Right Meets Wrong: Bilateral Context Conditioning with
    Reward-Confidence Correction for GRPO" (arXiv:2603.13134; code github.com/Skylanding/BiCC).
    The variance-minimising baseline weights rewards by the squared score/importance weight;
    to first order in the log-ratio ``c = log pi_theta - log pi_ref`` it is
    ``E[R] + 2 Cov(R, c)``, hence ``coef = 2``. As the policy grows confident on its rewarded
    samples the covariance rises and the plain group mean becomes a poor baseline. The paper
    works with binary rewards; the formula applies unchanged to continuous ones.

    ``confidence`` is supplied by the trainer (run-time input, not config): one value per sample,
    ``[B]``, or one per column, shaped like the rewards (e.g. per trained step). Without it the
    correction is 0 and ``rcc`` equals ``group`` (the on-policy first-order case ``c = 0``).
    A constant group still gets exactly 0. The trainer passes the sampling policy's log-prob of
    each trajectory, summed over its trained steps: the paper's ``log pi_ref`` term is dropped
    (it would cost a reference call per trained step and sample), and likelihood-free
    objectives, which keep no per-step log-probs, pass zeros (then ``rcc`` is ``group``).

    Args:
        rewards, groups, eps: as :func:`group_advantages`.
        confidence: ``[B]`` or ``[B, *E]`` finite confidences, or ``None``.
        coef: covariance coefficient (first-order theory: 2).

    Returns:
        Advantages shaped like ``rewards``.
    """
    coef = _real("coef", coef)
    rewards, _, std, _, centred = _stats(rewards, groups)
    if confidence is None:
        return centred / (std + eps)
    if not isinstance(confidence, Tensor):
        raise TypeError(f"confidence must be a tensor (or None), got {type(confidence).__name__}")
    conf = confidence.detach().float().to(rewards.device)
    if conf.shape == rewards.shape[:1]:
        conf = conf.reshape(-1, *([1] * (rewards.ndim - 1))).expand_as(rewards)
    if conf.shape != rewards.shape:
        raise ValueError(f"confidence must have shape [B] = {tuple(rewards.shape[:1])} or the "
                         f"rewards' {tuple(rewards.shape)}, got {tuple(confidence.shape)}")
    if not bool(torch.isfinite(conf).all()):
        raise ValueError("confidence contains NaN or infinite values")
    groups = groups.long().to(rewards.device)
    cov = _group_mean(centred * (conf - _group_mean(conf, groups)), groups)
    return (centred - coef * cov) / (std + eps)
