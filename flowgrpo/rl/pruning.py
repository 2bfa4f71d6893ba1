"""Unbiased pruning of low-information samples before the policy update (DPPO).

Source: Zhu, Ren, Li, Lin, Yang, Liu, Zhen, Liu, Zhang, "Unbiased Dynamic Pruning for Efficient
Group-Based Policy Optimization" (DPPO), arXiv:2603.04135 (ICML 2026, PMLR v306,
``mlresearch/v306/assets/zhu26an/zhu26an.pdf``). No code from the paper is used; this module
re-derives the rule from its description:

* pruning is hierarchical: first whole prompts (groups) of low value are pruned with rate
  ``r_q``, then, inside the surviving groups, completions (samples) of low intra-group
  advantage are pruned with rate ``r_o``;
* pruning is random, never deterministic, and every survivor's gradient is rescaled by the
  inverse of its keep probability (importance-sampling correction), so the expected pruned
  gradient equals the full-batch GRPO gradient and the optimisation objective is unchanged;
* the paper reports a bounded estimator variance for ``r_q, r_o <= 0.7`` and a modest rise
  at ``0.9``.

The paper scores prompts from their *history* (earlier epochs); a pruner here sees only the
current batch, so a group's score is its mean ``|A|`` in this batch. The paper's exact
thresholds were not available to us; which samples count as "low" is this module's choice (a
deterministic function of the advantages, so the keep probabilities are fixed before any coin
is drawn and the rescaling stays exact; any such choice keeps the estimator unbiased):

* group level: a group is low when its mean ``|A|`` is below the mean over the batch's groups
  of non-zero advantage (an all-zero group is always low);
* sample level: a sample is low when its ``|A|`` (mean over any extra axes) is below the mean
  ``|A|`` of its group (CPPO's observation, Lin et al. 2025: low-``|A|`` completions carry
  the least signal).

A low group is kept with probability ``1 - group_rate``, a low sample with ``1 - sample_rate``,
anything else with probability 1; the draws are independent, so a sample's keep probability is
``p_i = p_group * p_sample`` and its weight ``1 / p_i``. Hence for any per-sample gradient
contributions ``g_i``::

    E[sum_{i in keep} w_i g_i] = sum_i P(i kept) / p_i * g_i = sum_i g_i.

``level="group"`` keeps or drops a whole group (every sample of a kept group is kept, one
weight per group), ``level="sample"`` decides each sample on its own, ``level="hierarchical"``
(the paper's, the default) does both.

Zero advantages. A sample whose advantage is all zero contributes no policy-gradient term, but
with a KL penalty (``beta > 0``) it still has a gradient. With ``drop_zero=True`` such samples
are dropped with probability 1 (unbiased only when ``g_i = 0`` for them); the trainer must pass
``drop_zero=True`` only when ``train.beta == 0``, as it does for ``skip_zero_advantage``. With
``drop_zero=False`` they are treated as low-information samples (and an all-zero group as a
low group) and are kept with a positive probability, so the estimator is unbiased for every
``g``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from flowgrpo.registry import Registry
from flowgrpo.validation import is_number, one_of

Pruner = Callable[[Tensor, Tensor, torch.Generator], tuple[Tensor, Tensor]]

PRUNERS: Registry[Callable[..., Pruner]] = Registry("pruner")
LEVELS = ("hierarchical", "group", "sample")

__all__ = ["LEVELS", "PRUNERS", "DPPOPruner", "NoPruner", "build", "names", "saved_fraction"]


def _scores(adv: Tensor, groups: Tensor) -> tuple[Tensor, Tensor]:
    """Validate; return ``(score [B] float32 = mean |A| per sample, groups long [B])`` on CPU.
    An empty batch (nothing left to train, e.g. every group's rewards were equal) is valid."""
    if adv.ndim == 0:
        raise ValueError(f"adv must be a tensor [B, ...], got shape {tuple(adv.shape)}")
    if groups.shape != adv.shape[:1]:
        raise ValueError(f"groups must have shape [B] = {tuple(adv.shape[:1])}, "
                         f"got {tuple(groups.shape)}")
    if groups.is_floating_point() or groups.is_complex():
        raise ValueError(f"groups must be an integer tensor of group ids, got {groups.dtype}")
    flat = adv.detach().float().cpu().flatten(1) if adv.ndim > 1 else adv.detach().float()[:, None]
    if not torch.isfinite(flat).all():
        raise ValueError("adv holds NaN or infinite values")
    return flat.abs().mean(1), groups.detach().long().cpu()


def _result(keep: Tensor, weight: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
    return keep.to(device=device, dtype=torch.long), weight.to(device=device,
                                                               dtype=torch.float32)


@PRUNERS.register("none")
class NoPruner:
    """Keep every sample with weight 1."""

    def __call__(self, adv: Tensor, groups: Tensor,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
        score, _ = _scores(adv, groups)
        n = len(score)
        return _result(torch.arange(n), torch.ones(n), adv.device)

    def keep_probabilities(self, adv: Tensor, groups: Tensor) -> Tensor:
        """``[B]`` float32 ones."""
        return torch.ones(len(_scores(adv, groups)[0]))


@PRUNERS.register("dppo")
class DPPOPruner:
    """DPPO's unbiased hierarchical pruning (see the module docstring).

    Args:
        group_rate: ``r_q``, the probability of dropping a low-information group, in [0, 1).
        sample_rate: ``r_o``, the probability of dropping a low-information sample, in [0, 1).
        level: ``hierarchical`` (groups, then samples), ``group`` or ``sample``.
        drop_zero: drop all-zero-advantage samples with probability 1 (only valid without a
            KL term, ``beta == 0``); otherwise they are low-information samples.
    """

    def __init__(self, group_rate: float = 0.5, sample_rate: float = 0.5,
                 level: str = "hierarchical", drop_zero: bool = True) -> None:
        for name, rate in (("group_rate", group_rate), ("sample_rate", sample_rate)):
            if not is_number(rate) or not 0.0 <= rate < 1.0:
                raise ValueError(f"dppo {name} must be a number in [0, 1) (a rate of 1 gives a "
                                 f"zero keep probability and a biased gradient), got {rate!r}")
        one_of("dppo level", level, LEVELS)
        if not isinstance(drop_zero, bool):
            raise ValueError(f"dppo drop_zero must be true or false, got {drop_zero!r}")
        self.group_rate, self.sample_rate = float(group_rate), float(sample_rate)
        self.level, self.drop_zero = level, drop_zero

    def _probabilities(self, score: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(p_group [B], p_sample [B], inverse [B])``: keep probabilities per sample of its
        group and of itself (0 for dropped zero-advantage samples), and each sample's group
        index."""
        ids, inverse = torch.unique(groups, return_inverse=True)
        count = torch.zeros(len(ids)).index_add(0, inverse, torch.ones_like(score))
        group_score = torch.zeros(len(ids)).index_add(0, inverse, score) / count
        zero = score == 0
        p_group = torch.ones(len(ids))
        if self.level != "sample":
            informative = group_score > 0
            mean = group_score[informative].mean() if informative.any() else 0.0
            low = (group_score < mean) | ~informative
            p_group[low] = 1.0 - self.group_rate
        p_sample = torch.ones_like(score)
        if self.level != "group":
            low = score < group_score[inverse]
            if not self.drop_zero:
                low |= zero
            p_sample[low] = 1.0 - self.sample_rate
        if self.drop_zero:
            p_sample[zero] = 0.0
        return p_group[inverse], p_sample, inverse

    def keep_probabilities(self, adv: Tensor, groups: Tensor) -> Tensor:
        """``[B]`` float32: the probability that each sample is kept (its weight is 1 / it)."""
        p_group, p_sample, _ = self._probabilities(*_scores(adv, groups))
        return p_group * p_sample

    def __call__(self, adv: Tensor, groups: Tensor,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw the kept samples.

        Args:
            adv: ``[B, ...]`` advantages (any device; decisions are made on the CPU).
            groups: ``[B]`` integer group ids.
            generator: a CPU ``torch.Generator``; the same state gives the same result.

        Returns:
            ``(keep [k] long, weight [k] float32)`` on ``adv``'s device, ``keep`` ascending:
            the kept sample indices and their importance weights ``1 / p_keep``.
        """
        p_group, p_sample, inverse = self._probabilities(*_scores(adv, groups))
        # one coin per group and one per sample, always both, so the draws depend only on B
        # and the number of groups
        num_groups = int(inverse.max()) + 1 if len(inverse) else 0
        group_coin = torch.rand(num_groups, generator=generator)[inverse]
        sample_coin = torch.rand(len(p_sample), generator=generator)
        kept = (group_coin < p_group) & (sample_coin < p_sample)
        keep = kept.nonzero().flatten()
        weight = 1.0 / (p_group[keep] * p_sample[keep])
        return _result(keep, weight, adv.device)


def build(name: str, **params) -> Pruner:
    """The pruner registered as ``name`` built with ``params``.

    Raises:
        UnknownNameError: an unknown name (a ValueError naming the valid ones).
        ValueError: an unknown parameter (:class:`~flowgrpo.registry.ParameterError`) or a bad
            value, in one line.
    """
    return PRUNERS.build(name, **params)


def names() -> list[str]:
    """Registered pruner names, sorted."""
    return PRUNERS.names()


def saved_fraction(keep: Tensor | int, batch: int) -> float:
    """Fraction of the ``batch`` samples' training forwards that pruning saved.

    Args:
        keep: the kept indices (or their count).
        batch: the number of samples before pruning (> 0).
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    kept = keep if isinstance(keep, int) else int(keep.numel())
    if not 0 <= kept <= batch:
        raise ValueError(f"{kept} samples kept out of a batch of {batch}")
    return 1.0 - kept / batch
