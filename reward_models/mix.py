"""Mixes of rewards, and :func:`build_reward`, the one way configs turn into a reward.

A mix is itself a reward whose ``scores`` combine its parts' by a registered mode
(:data:`MIX_MODES`, config ``reward.mix_mode``), and whose ``components`` carry every part's own
``[B]`` scores so the trainer can log them (``reward/<key>``) or normalize them one by one (GDPO)
without ever looking at reward names.

========== ========================================================================================
mode       ``scores[i]``
========== ========================================================================================
weighted   ``sum_k w_k scores_k[i]`` (the default)
sample     ``scores_k[i]`` for one reward ``k`` drawn per sample with probability
           ``w_k / sum_k w_k`` (FlowTTS-GRPO's probabilistic scheme). The draw is a function of
           the mix's seed and the sample's ``metadata["iteration"]`` and ``["sample"]`` (its global
           index, which the trainer sets), so it is the same on any number of processes and on a
           resumed run; without them (eval, a direct call) the sample's group and position in the
           batch key it. Its expectation over draws is the weighted mean.
========== ========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flowgrpo import seeding
from flowgrpo.registry import Registry, short_name

from .base import Reward, RewardOutput, build, register
from .media import Media

MIX_MODES: Registry[Callable[..., torch.Tensor]] = Registry("mix mode")


@MIX_MODES.register("weighted")
def weighted_mode(scores: torch.Tensor, weights: torch.Tensor, metadata: list[dict],
                  seed: int) -> torch.Tensor:
    """``[K, B]`` part scores -> ``sum_k w_k scores_k`` ``[B]``."""
    return (weights[:, None] * scores).sum(0)


def _unit_draw(seed: int, meta: dict, position: int) -> float:
    """A uniform number in [0, 1) keyed by the seed and the sample's identity."""
    if "sample" in meta and "iteration" in meta:
        return seeding.uniform("mix_draw", seed, meta["iteration"], meta["sample"])
    return seeding.uniform("mix_eval_draw", seed, meta.get("group", ""), position)


@MIX_MODES.register("sample")
def sample_mode(scores: torch.Tensor, weights: torch.Tensor, metadata: list[dict],
                seed: int) -> torch.Tensor:
    """``[K, B]`` part scores -> for each sample the score of one part drawn with probability
    ``w_k / sum w`` (weights must be >= 0 with a positive sum)."""
    if bool((weights < 0).any()) or not float(weights.sum()) > 0:
        raise ValueError(f"mix_mode sample draws each reward with probability proportional to "
                         f"its weight: weights must be >= 0 with a positive sum, got "
                         f"{weights.tolist()}")
    edges = torch.cumsum(weights.double(), 0) / weights.double().sum()
    draws = torch.tensor([_unit_draw(seed, m, i) for i, m in enumerate(metadata)],
                         dtype=torch.float64)
    pick = torch.searchsorted(edges, draws, right=True).clamp(max=len(weights) - 1)
    return scores.gather(0, pick.to(scores.device)[None]).squeeze(0)


def _entries(spec: Any, params: dict[str, dict] | None = None) -> list[dict]:
    """Normalize a spec into ``[{"name", "weight", "params", "key"}]`` entries."""
    if isinstance(spec, dict) and "name" not in spec:  # {name: weight} shorthand
        params = params or {}
        return [{"name": n, "weight": w, "params": params.get(n, {})} for n, w in spec.items()]
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    entries = []
    for item in items:
        if isinstance(item, str) or callable(item):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(
                "a reward spec is a name, a callable, or {'name', 'weight', 'params'}; "
                f"got {item!r}"
            )
        unknown = set(item) - {"name", "weight", "params", "key"}
        if unknown:
            raise ValueError(f"unknown reward spec keys {sorted(unknown)}; valid: name, weight, "
                             "params, key")
        entries.append({"weight": 1.0, "params": {}, **item})
    return entries


def _instantiate(entry: dict) -> Reward:
    name = entry["name"]
    if callable(name) and not isinstance(name, str):
        if entry["params"]:
            raise ValueError("params cannot be applied to an already built reward")
        return name
    return build(name, **(entry["params"] or {}))


def _unique_keys(entries: list[dict]) -> list[str]:
    """``key`` if given, else the reward name (a reference's attribute: ``my.py:sharpness`` ->
    ``sharpness``); repeats get ``_2``, ``_3``, ... suffixes."""
    keys, seen = [], set()
    for entry in entries:
        name = entry["name"]
        base = entry.get("key") or (short_name(name) if isinstance(name, str)
                                    else type(name).__name__)
        key, n = base, 1
        while key in seen:
            n += 1
            key = f"{base}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


@register("mix")
class Mix:
    """A mix of rewards.

    Args:
        components: list of ``{"name", "weight" (default 1), "params" (default {}), "key"}``
            (``name`` may also be a built reward), or a dict ``{name: weight}``.
        params: with the dict form, ``{name: params}``.
        mode: how the parts' scores combine (:data:`MIX_MODES`: ``weighted``, ``sample``).
        seed: the ``sample`` mode's draws (the trainer passes the run seed).

    Output: ``scores`` by ``mode``; ``components[key_k] = scores_k`` (a nested mix's parts appear
    as ``key/part``); ``regions``, when any part has them, are the weighted sum with region-less
    parts contributing their score everywhere (``weighted`` mode only); ``info`` keys get a
    ``key/`` prefix.
    """

    def __init__(self, components: Any, params: dict[str, dict] | None = None,
                 mode: str = "weighted", seed: int = 0) -> None:
        entries = _entries(components, params)
        if not entries:
            raise ValueError("mix needs at least one component")
        self.combine = MIX_MODES.get(mode)
        self.mode, self.seed = mode, int(seed)
        self.keys = _unique_keys(entries)
        self.weights = [float(e["weight"]) for e in entries]
        if mode == "sample":  # check the weights now, not at the first rollout
            sample_mode(torch.zeros(len(entries), 0), torch.tensor(self.weights), [], 0)
        self.rewards = [_instantiate(e) for e in entries]
        self.groupwise = any(getattr(r, "groupwise", False) for r in self.rewards)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        outputs = [reward(media, prompts, metadata) for reward in self.rewards]
        parts = torch.stack([o.scores.float() for o in outputs])
        scores = self.combine(parts, torch.tensor(self.weights, device=parts.device), metadata,
                              self.seed)
        components: dict[str, torch.Tensor] = {}
        info: dict[str, Any] = {}
        for key, out in zip(self.keys, outputs):
            components[key] = out.scores.float()
            for sub, value in (out.components or {}).items():
                components[f"{key}/{sub}"] = value
            info.update({f"{key}/{k}": v for k, v in out.info.items()})
        return RewardOutput(
            scores=scores, regions=self._regions(outputs), components=components, info=info
        )

    def _regions(self, outputs: list[RewardOutput]) -> torch.Tensor | None:
        shapes = {tuple(o.regions.shape) for o in outputs if o.regions is not None}
        if not shapes:
            return None
        if len(shapes) > 1:
            raise ValueError(f"mixed rewards return regions on different grids: {sorted(shapes)}")
        if self.mode != "weighted":
            raise ValueError(f"region rewards mix only in the weighted mode, not {self.mode!r}")
        (shape,) = shapes
        total = torch.zeros(shape)
        for w, out in zip(self.weights, outputs):
            part = out.regions if out.regions is not None else out.scores[:, None, None]
            total = total + w * part.float().cpu().expand(shape)
        return total


def build_reward(spec: Any, params: dict | None = None, mode: str = "weighted",
                 seed: int = 0) -> Reward:
    """Turn a config value into one reward.

    ``spec`` is a registered name (with ``params``), a built reward (returned as is), one
    ``{"name", "params", "weight"}`` dict, a list of them, or a ``{name: weight}`` dict. Several
    entries, or one whose weight is not 1, become a :class:`Mix` combining by ``mode`` (with
    ``seed``).
    """
    if isinstance(spec, str):
        return build(spec, **(params or {}))
    if params:
        raise ValueError("params go inside the spec entries when spec is not a single name")
    if callable(spec):
        return spec
    entries = _entries(spec)
    if len(entries) == 1 and float(entries[0]["weight"]) == 1.0 and not entries[0].get("key"):
        return _instantiate(entries[0])
    return Mix(entries, mode=mode, seed=seed)
