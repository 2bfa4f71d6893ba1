"""Group-relative advantages: one registered estimator per normalization, one combiner.

Every prompt is sampled ``group_size`` times; a sample's advantage is its reward relative to the
other samples of its group (GRPO, Shao et al. 2024, "DeepSeekMath"):

    A_i = (r_i - mean_{g(i)}) / (std + eps)

Rewards may carry extra axes, ``[B, *E]``: per trained step ``[B, J]`` (TurningPoint-GRPO), per
view ``[B, V]`` (MV-GRPO), per region ``[B, h, w]`` (SpatialFlow-GRPO). Every column (one index
into ``E``) is normalised within its group on its own, by the same code as a ``[B]`` reward.

The estimators differ only in the ``std`` they divide by:

=============  =======================================  =========================================
name           std                                      reference
=============  =======================================  =========================================
``group``      population std of the sample's group     GRPO / Flow-GRPO (Liu et al. 2025)
``global_std`` population std of the whole batch       Flow-GRPO's ``global_std`` option
``none``       no division (``A = r - mean_group``)     Dr.GRPO (Liu et al. 2025, "Understanding
                                                        R1-Zero-like training")
=============  =======================================  =========================================

Four more estimators reshape the GRPO advantage ``z = (r - mean_g) / (std_g + eps)`` (details and
sources in their docstrings):

===============  ====================================================  ==========================
name             advantage                                             reference
===============  ====================================================  ==========================
``focal``        ``z * (1 - p_g)^gamma``                               F-GRPO, arXiv:2602.06717
``a_grae``       easy/hard reweighting of ``z`` on a curriculum,       A-GRAE, arXiv:2602.05548
                 positive advantages attenuated
``dual_anchor``  ``z + alpha (r - b) / (s + eps)``, ``b``/``s`` a      MDP-GRPO, arXiv:2606.06058
                 running (EMA) batch mean/std kept in ``state``
``rcc``          ``(r - mean_g - coef Cov_g(r, c)) / (std_g + eps)``   BiCC/RCC, arXiv:2603.13134
===============  ====================================================  ==========================

``p_g`` is a group's success rate: its mean reward normalised to ``[0, 1]`` (see
:func:`success_rate`), exactly the fraction of successes for binary rewards.

Estimators may declare extra keyword-only parameters, set from the config
(``train.advantage_params``; :func:`estimator_params` lists them), and the run-time inputs
:data:`RUNTIME_INPUTS` (``state``, ``progress``, ``confidence``), which
:func:`compute_advantages` passes only to an estimator whose signature declares them.

Standard deviations are population ones (``ddof = 0``, as ``np.std`` in the Flow-GRPO reference),
so with ``group`` every group of non-constant rewards has zero mean and, up to ``eps``, unit
standard deviation. A group whose rewards are all equal (including a group of one sample) carries
no preference: its advantages are exactly zero, and :func:`compute_advantages` reports the fraction
of such groups as ``rollout/zero_std_frac``. :func:`zero_std_groups` marks their samples so the
trainer can skip them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, MutableMapping

import torch
from torch import Tensor

from flowgrpo import registry
from flowgrpo.registry import Registry
from flowgrpo.validation import is_number

Estimator = Callable[..., Tensor]
Rewards = Tensor | Mapping[str, Tensor]

ADVANTAGES: Registry[Estimator] = Registry("advantage estimator")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")

RUNTIME_INPUTS = ("state", "progress", "confidence")
"""Inputs the trainer supplies per call (never the config); passed only to estimators declaring
them: ``state`` (a mutable JSON-serialisable dict kept across iterations and saved in
checkpoints), ``progress`` (fraction of training done, in ``[0, 1]``), ``confidence`` (a per-sample
policy-confidence tensor, ``[B]`` or shaped like the rewards)."""
SUPPLIED = ("rewards", "groups", "eps", *RUNTIME_INPUTS)
"""Parameters the trainer supplies to every estimator: a config cannot set them."""

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "RUNTIME_INPUTS",
    "SUPPLIED",
    "check_params",
    "compute_advantages",
    "estimator_params",
    "get",
    "runtime_inputs",
    "zero_std_groups",
]


def get(name: str) -> Estimator:
    """Return the advantage estimator registered as ``name`` (``group``, ``focal``, ...).

    Raises:
        UnknownNameError: naming the valid estimators.
    """
    return ADVANTAGES.get(name)


def _keyword_names(fn: Callable[..., object]) -> list[str]:
    """Names ``fn`` accepts as keyword arguments, in signature order."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in keyword]


def estimator_params(name: str) -> list[str]:
    """The parameters a config (``train.advantage_params``) may set for estimator ``name``.

    Every keyword parameter of the estimator except those the caller supplies: ``rewards``,
    ``groups``, ``eps`` and the run-time inputs :data:`RUNTIME_INPUTS`.

    Raises:
        UnknownNameError: naming the valid estimators.
    """
    return [p for p in _keyword_names(get(name)) if p not in SUPPLIED]


def runtime_inputs(name: str) -> list[str]:
    """The run-time inputs (:data:`RUNTIME_INPUTS`) estimator ``name`` declares, so a caller
    computes only those (``confidence`` costs a gather across processes)."""
    return [p for p in _keyword_names(get(name)) if p in RUNTIME_INPUTS]


def check_params(name: str, params: Mapping[str, object] | None) -> None:
    """Check that ``params`` only names parameters of estimator ``name`` (values are checked
    when the estimator runs).

    Raises:
        UnknownNameError: ``name`` is not a registered estimator.
        TypeError: one line naming the unknown parameter, the closest valid one and every valid
            one (``state``/``progress``/``confidence`` come from the trainer, not the config).
    """
    registry.check_params(get(name), params, supplied=SUPPLIED,
                          label=f"advantage estimator {name!r}")


def _real(name: str, value: object, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float within the given bounds, else a one-line TypeError/ValueError."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or below or above:
        interval = (f"{'(' if low_open else '['}{'-inf' if low is None else low}, "
                    f"{'inf' if high is None else high}{')' if high_open else ']'}")
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return value


def _validated(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor]:
    """Validate shapes and values; return ``(rewards float32 [B, *E], groups long [B])``."""
    if rewards.ndim == 0 or rewards.numel() == 0:
        raise ValueError(
            f"rewards must be a non-empty tensor [B] or [B, *E], got shape {tuple(rewards.shape)}"
        )
    if groups.shape != rewards.shape[:1]:
        raise ValueError(
            f"groups must have shape [B] = {tuple(rewards.shape[:1])} (the rewards' first "
            f"dim), got {tuple(groups.shape)}"
        )
    if groups.is_floating_point() or groups.is_complex():
        raise ValueError(f"groups must be an integer tensor of group ids, got {groups.dtype}")
    rewards = rewards.detach().float()
    bad = ~torch.isfinite(rewards)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} of {rewards.numel()} rewards are NaN or infinite")
    return rewards, groups.long().to(rewards.device)


def _group_stats(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group statistics of every column.

    Args:
        rewards: ``[B, *E]`` float32; groups: ``[B]`` long.

    Returns:
        ``(mean, std, constant)``, each ``[B, *E]``: the mean and population std of the column
        within each sample's group, and whether that group's column is all equal (exactly: max
        == min, so a constant group is detected even when rounding makes its std a tiny number).
    """
    shape = rewards.shape
    flat = rewards.reshape(shape[0], -1)
    ids, inverse = torch.unique(groups, return_inverse=True)
    num, cols = ids.numel(), flat.shape[1]
    index = inverse[:, None].expand_as(flat)
    zeros = torch.zeros(num, cols, device=flat.device)
    count = zeros.index_add(0, inverse, torch.ones_like(flat))
    mean = zeros.index_add(0, inverse, flat) / count
    dev = flat - mean[inverse]
    var = zeros.index_add(0, inverse, dev * dev) / count
    high = torch.full((num, cols), -torch.inf, device=flat.device)
    low = torch.full((num, cols), torch.inf, device=flat.device)
    high = high.scatter_reduce(0, index, flat, reduce="amax")
    low = low.scatter_reduce(0, index, flat, reduce="amin")
    constant = (high == low)[inverse]
    return (mean[inverse].reshape(shape), var.sqrt()[inverse].reshape(shape),
            constant.reshape(shape))


def _centred(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(r - mean_group`` with constant groups exactly 0``, group std, rewards)``, each
    ``[B, *E]``."""
    rewards, groups = _validated(rewards, groups)
    mean, std, constant = _group_stats(rewards, groups)
    centred = torch.where(constant, torch.zeros_like(rewards), rewards - mean)
    return centred, std, rewards


@ADVANTAGES.register("group")
def group_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4) -> Tensor:
    """GRPO advantages ``A_i = (r_i - mean_g) / (std_g + eps)``, population std of the group.

    Args:
        rewards: ``[B]`` scalar rewards or ``[B, *E]`` (each column normalised on its own; any
            float dtype, computed in float32).
        groups: ``[B]`` integer group ids (samples of one prompt share an id; ids need not be
            contiguous or sorted).
        eps: added to the std so nearly-constant groups do not explode.

    Returns:
        Advantages shaped like ``rewards``, float32; exactly 0 where a group's column is
        constant.
    """
    centred, std, _ = _centred(rewards, groups)
    return centred / (std + eps)


@ADVANTAGES.register("global_std")
def global_std_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4) -> Tensor:
    """``A_i = (r_i - mean_g) / (std_batch + eps)``: group mean, population std of all B rewards
    of the column.

    One scale for the whole batch keeps groups with a small spread from being inflated to the
    same magnitude as groups with a large one. Shapes as :func:`group_advantages`.
    """
    centred, _, rewards = _centred(rewards, groups)
    return centred / (rewards.std(dim=0, correction=0, keepdim=True) + eps)


@ADVANTAGES.register("none")
def mean_only_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-4) -> Tensor:
    """Dr.GRPO advantages ``A_i = r_i - mean_g`` (no std division; ``eps`` is unused).

    Dividing by the group std up-weights groups that are nearly solved or nearly failed; Dr.GRPO
    drops the division to remove that difficulty bias. Shapes as :func:`group_advantages`.
    """
    centred, _, _ = _centred(rewards, groups)
    return centred


def _as_named(
    rewards: Rewards, weights: Mapping[str, float] | None
) -> dict[str, tuple[Tensor, float]]:
    """Normalize ``rewards``/``weights`` into ``{name: (reward [B], weight)}``."""
    if isinstance(rewards, Tensor):
        # Already one (possibly pre-mixed) reward: the weights were applied by whoever mixed it.
        return {"reward": (rewards, 1.0)}
    if not rewards:
        raise ValueError("rewards is an empty dict; give at least one named reward")
    weights = dict(weights) if weights is not None else {name: 1.0 for name in rewards}
    missing = sorted(set(rewards) - set(weights))
    extra = sorted(set(weights) - set(rewards))
    if missing or extra:
        raise ValueError(
            f"weights must name exactly the rewards {sorted(rewards)}; "
            f"missing: {missing}, unknown: {extra}"
        )
    return {name: (value, float(weights[name])) for name, value in rewards.items()}


def _constant_mask(values: list[Tensor], groups: Tensor) -> Tensor:
    """``[B]`` bool: True where every column of each of ``values`` is constant within the
    sample's group."""
    mask = torch.ones(groups.shape, dtype=torch.bool, device=groups.device)
    for value in values:
        constant = _group_stats(*_validated(value, groups))[2]
        mask = mask.to(constant.device) & constant.reshape(len(constant), -1).all(1)
    return mask


def zero_std_groups(rewards: Rewards, groups: Tensor) -> Tensor:
    """Mark the samples whose group carries no preference.

    Args:
        rewards: ``[B, *E]`` rewards, or a dict of named ones (then a group counts only when
            every column of every named reward is constant within it).
        groups: ``[B]`` integer group ids.

    Returns:
        ``[B]`` bool, True where all rewards of the sample's group are equal: those samples get
        zero advantage under every estimator, so the trainer may skip their training forwards.
    """
    values = [rewards] if isinstance(rewards, Tensor) else list(rewards.values())
    if not values:
        raise ValueError("rewards is an empty dict; give at least one named reward")
    return _constant_mask(values, groups)


def compute_advantages(
    rewards: Rewards,
    groups: Tensor,
    estimator: str = "group",
    adv_clip: float | None = 5.0,
    weights: Mapping[str, float] | None = None,
    aggregation: str = "sum_then_normalize",
    eps: float = 1e-4,
    params: Mapping[str, object] | None = None,
    state: MutableMapping | None = None,
    progress: float = 0.0,
    confidence: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Advantages of one (gathered) batch of rollouts, with their rollout metrics.

    Args:
        rewards: ``[B, *E]`` rewards, or ``{name: [B, *E]}`` named rewards combined with
            ``weights``; every column is normalised within its group on its own.
        groups: ``[B]`` integer group ids (one id per prompt).
        estimator: registered estimator name (``group``, ``global_std``, ``none``).
        adv_clip: advantages are clipped to ``[-adv_clip, adv_clip]``; ``None`` or 0 disables.
        weights: ``{name: weight}`` for named rewards (default: 1.0 each); must name exactly the
            rewards. Ignored when ``rewards`` is a single tensor (a reward already mixed).
        aggregation: how named rewards combine (a single tensor is one reward of weight 1):

            - ``sum_then_normalize``: ``A = est(sum_k w_k r_k)``; one normalization of the mix.
            - ``normalize_then_sum`` (GDPO, Liu et al. 2026, arXiv:2601.05242; constrained GRPO):
              ``S = sum_k w_k est(r_k)``, then ``A = S / (std_batch(S) + eps)`` (population std
              of each column).
              Normalizing each reward first keeps distinct reward combinations from collapsing to
              the same advantage; the final batch normalization keeps the scale from growing with
              the number of rewards. ``S`` already has zero mean in every group, hence over the
              batch, so GDPO's batch-wise standardization reduces to this division.
        eps: the estimators' (and the batch renormalization's) ``eps``.
        params: the estimator's extra parameters (``train.advantage_params``); names are checked
            by :func:`check_params` (one-line TypeError), values by the estimator.
        state: a mutable JSON-serialisable dict the trainer keeps across iterations and saves
            in checkpoints; passed only to an estimator declaring ``state`` (``dual_anchor``).
            With ``sum_then_normalize`` the estimator gets ``state`` itself; with
            ``normalize_then_sum`` it runs once per named reward and gets ``state[name]`` (a
            sub-dict created on first use), so each reward keeps its own running statistics.
        progress: fraction of training done, in ``[0, 1]``; passed only to an estimator
            declaring ``progress`` (``a_grae``).
        confidence: per-sample policy confidence, ``[B]`` or shaped like the rewards; passed only
            to an estimator declaring ``confidence`` (``rcc``).

    Returns:
        ``(advantages [B, *E] float32, metrics)`` with float metrics ``rollout/zero_std_frac``
        (fraction of groups whose advantages are all zero because their rewards are constant),
        ``rollout/adv_abs_mean`` (mean ``|A|`` after clipping) and ``rollout/adv_clipped_frac``
        (fraction of samples with ``|A| > adv_clip`` before clipping).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {aggregation!r}; valid names: {', '.join(AGGREGATIONS)}"
        )
    if adv_clip is not None and adv_clip < 0:
        raise ValueError(f"adv_clip must be positive (or None/0 to disable), got {adv_clip}")
    estimate = get(estimator)
    check_params(estimator, params)
    progress = _real("progress", progress, low=0.0, high=1.0)
    if state is not None and not isinstance(state, MutableMapping):
        raise TypeError(f"state must be a dict (or None), got {type(state).__name__}")
    declared = _keyword_names(estimate)
    kwargs = dict(params or {})
    kwargs.update({key: value for key, value in (("progress", progress),
                                                ("confidence", confidence)) if key in declared})
    stateful = "state" in declared
    named = _as_named(rewards, weights)

    if aggregation == "sum_then_normalize":
        mixed = sum(w * _validated(r, groups)[0] for r, w in named.values())
        if stateful:
            kwargs["state"] = state
        adv = estimate(mixed, groups, eps=eps, **kwargs)
        constant = _constant_mask([mixed], groups)
    else:
        def one(name: str, reward: Tensor) -> Tensor:
            if stateful:
                kwargs["state"] = None if state is None else state.setdefault(name, {})
            return estimate(reward, groups, eps=eps, **kwargs)

        summed = sum(w * one(name, r) for name, (r, w) in named.items())
        adv = summed / (summed.std(dim=0, correction=0, keepdim=True) + eps)
        # A reward of weight 0 cannot make a group's advantages non-zero.
        constant = _constant_mask([r for r, w in named.values() if w != 0], groups)

    clipped_frac = 0.0
    if adv_clip:
        clipped_frac = (adv.abs() > adv_clip).float().mean().item()
        adv = adv.clamp(-adv_clip, adv_clip)

    group_ids = groups.long().to(constant.device)
    num_groups = torch.unique(group_ids).numel()
    num_constant = torch.unique(group_ids[constant]).numel()
    metrics = {
        "rollout/zero_std_frac": num_constant / num_groups,
        "rollout/adv_abs_mean": adv.abs().mean().item(),
        "rollout/adv_clipped_frac": clipped_frac,
    }
    return adv, metrics


# the estimators beyond GRPO register themselves here
