"""Group-wise rewards: scores that only make sense relative to the other samples of a prompt group.

``winrate`` (Pref-GRPO, Wang et al. 2025): each sample's fraction of wins against the other
members of its group under a point-wise scorer; a tie counts half. Turning absolute scores into
win rates removes the scorer's scale and makes "reward hacking" by inflating an already winning
score pointless. With ``temperature > 0`` a win is soft: ``sigmoid((s_i - s_j) / temperature)``
(the Bradley-Terry preference probability).

``rank``: the normalized rank within the group, ``(rank - 1) / (G - 1)`` in [0, 1] (0 = worst).
With ``ties="average"`` it equals the hard win rate (both count ``#{j: s_j < s_i} +
0.5 #{j != i: s_j == s_i}`` over ``G - 1``); ``ties="min"`` gives tied samples their lowest rank
and ``"max"`` their highest, so ties are not rewarded as half-wins.

Both need ``metadata[i]["group"]`` and set ``groupwise = True`` (the trainer passes whole groups).
A group of one sample scores 0.5.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from .base import RewardOutput, register
from .media import Media, check_batch
from .mix import build_reward


def group_indices(metadata: list[dict]) -> list[torch.Tensor]:
    """Indices of each group's samples ``[G_k]``, groups in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for i, meta in enumerate(metadata):
        if "group" not in meta:
            raise ValueError(f"group-wise rewards need metadata[{i}]['group'], the prompt group id")
        key = meta["group"]
        groups.setdefault(tuple(key) if isinstance(key, list) else key, []).append(i)
    return [torch.tensor(idx, dtype=torch.long) for idx in groups.values()]


def win_rates(scores: torch.Tensor, temperature: float = 0.0, tie_tol: float = 0.0) -> torch.Tensor:
    """``[G]`` scores -> ``[G]`` mean win against the other members (ties 0.5)."""
    g = scores.numel()
    if g == 1:
        return torch.full_like(scores, 0.5)
    diff = scores[:, None] - scores[None, :]  # [G, G], diff[i, j] = s_i - s_j
    if temperature > 0:
        wins = torch.sigmoid(diff / temperature)
    else:
        wins = (diff > tie_tol).float() + 0.5 * (diff.abs() <= tie_tol).float()
    wins.fill_diagonal_(0.0)
    return wins.sum(dim=1) / (g - 1)


def normalized_ranks(
    scores: torch.Tensor, ties: str = "average", tie_tol: float = 0.0
) -> torch.Tensor:
    """``[G]`` scores -> ``[G]`` rank in [0, 1] (0 = lowest score)."""
    g = scores.numel()
    if g == 1:
        return torch.full_like(scores, 0.5)
    diff = scores[:, None] - scores[None, :]
    below = (diff > tie_tol).float().sum(dim=1)
    tied = (diff.abs() <= tie_tol).float().sum(dim=1) - 1  # others tied with i
    offset = {"average": 0.5 * tied, "min": 0 * tied, "max": tied}.get(ties)
    if offset is None:
        raise ValueError(f"unknown ties rule {ties!r}; use average, min or max")
    return (below + offset) / (g - 1)


class _GroupReward:
    groupwise = True
    name = "groupwise"

    def __init__(self, inner: Any, inner_params: dict | None = None) -> None:
        self.inner = build_reward(inner, inner_params)

    def transform(self, scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        check_batch(media, prompts, metadata, reward=self.name)
        groups = group_indices(metadata)
        raw = self.inner(media, prompts, metadata)
        base = raw.scores.float().cpu()
        scores = torch.empty_like(base)
        for idx in groups:
            scores[idx] = self.transform(base[idx])
        info = {f"inner/{k}": v for k, v in raw.info.items()}
        info["inner_mean"] = float(base.mean())
        return RewardOutput(scores=scores, info=info)


@register("winrate")
class WinRate(_GroupReward):
    """Pairwise win rate of ``inner``'s scores within each group (Pref-GRPO).

    Args:
        inner: point-wise reward name, spec or built reward.
        inner_params: params for ``inner`` when it is a name.
        temperature: 0 for hard wins (ties 0.5); > 0 for ``sigmoid((s_i - s_j) / temperature)``.
        tie_tol: score differences up to this count as ties (hard wins only).
    """

    name = "winrate"

    def __init__(
        self, inner: Any, inner_params: dict | None = None, temperature: float = 0.0,
        tie_tol: float = 0.0,
    ) -> None:
        super().__init__(inner, inner_params)
        self.temperature, self.tie_tol = float(temperature), float(tie_tol)

    def transform(self, scores: torch.Tensor) -> torch.Tensor:
        return win_rates(scores, self.temperature, self.tie_tol)


@register("rank")
class Rank(_GroupReward):
    """Normalized rank of ``inner``'s scores within each group, in [0, 1].

    Args:
        inner: point-wise reward name, spec or built reward.
        inner_params: params for ``inner`` when it is a name.
        ties: ``"average"`` (default), ``"min"`` or ``"max"`` rank for tied samples.
        tie_tol: score differences up to this count as ties.
    """

    name = "rank"

    def __init__(
        self, inner: Any, inner_params: dict | None = None, ties: str = "average",
        tie_tol: float = 0.0,
    ) -> None:
        super().__init__(inner, inner_params)
        if ties not in ("average", "min", "max"):
            raise ValueError(f"unknown ties rule {ties!r}; use average, min or max")
        self.ties, self.tie_tol = ties, float(tie_tol)

    def transform(self, scores: torch.Tensor) -> torch.Tensor:
        return normalized_ranks(scores, self.ties, self.tie_tol)
