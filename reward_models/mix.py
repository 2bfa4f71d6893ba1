"""Weighted mixes of rewards, and :func:`build_reward`, the one way configs turn into a reward.

A mix is itself a reward: ``scores = sum_k w_k * scores_k``, and ``components`` carries every
part's own ``[B]`` scores so the trainer can log them (``reward/<key>``) or normalize them one by
one (GDPO) without ever looking at reward names.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Reward, RewardOutput, get, register
from .media import Media


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
    return get(name, **(entry["params"] or {}))


def _unique_keys(entries: list[dict]) -> list[str]:
    """``key`` if given, else the reward name; repeats get ``_2``, ``_3``, ... suffixes."""
    keys, seen = [], set()
    for entry in entries:
        name = entry["name"]
        base = entry.get("key") or (name if isinstance(name, str) else type(name).__name__)
        key, n = base, 1
        while key in seen:
            n += 1
            key = f"{base}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


@register("mix")
class Mix:
    """Weighted sum of rewards.

    Args:
        components: list of ``{"name", "weight" (default 1), "params" (default {}), "key"}``
            (``name`` may also be a built reward), or a dict ``{name: weight}``.
        params: with the dict form, ``{name: params}``.

    Output: ``scores = sum_k w_k scores_k``; ``components[key_k] = scores_k`` (a nested mix's parts
    appear as ``key/part``); ``regions``, when any part has them, are the same weighted sum with
    region-less parts contributing their score everywhere; ``info`` keys get a ``key/`` prefix.
    """

    def __init__(self, components: Any, params: dict[str, dict] | None = None) -> None:
        entries = _entries(components, params)
        if not entries:
            raise ValueError("mix needs at least one component")
        self.keys = _unique_keys(entries)
        self.weights = [float(e["weight"]) for e in entries]
        self.rewards = [_instantiate(e) for e in entries]
        self.groupwise = any(getattr(r, "groupwise", False) for r in self.rewards)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        outputs = [reward(media, prompts, metadata) for reward in self.rewards]
        scores = sum(w * o.scores.float() for w, o in zip(self.weights, outputs))
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
        (shape,) = shapes
        total = torch.zeros(shape)
        for w, out in zip(self.weights, outputs):
            part = out.regions if out.regions is not None else out.scores[:, None, None]
            total = total + w * part.float().cpu().expand(shape)
        return total


def build_reward(spec: Any, params: dict | None = None) -> Reward:
    """Turn a config value into one reward.

    ``spec`` is a registered name (with ``params``), a built reward (returned as is), one
    ``{"name", "params", "weight"}`` dict, a list of them, or a ``{name: weight}`` dict. Several
    entries, or one whose weight is not 1, become a :class:`Mix`.
    """
    if isinstance(spec, str):
        return get(spec, **(params or {}))
    if params:
        raise ValueError("params go inside the spec entries when spec is not a single name")
    if callable(spec):
        return spec
    entries = _entries(spec)
    if len(entries) == 1 and float(entries[0]["weight"]) == 1.0 and not entries[0].get("key"):
        return _instantiate(entries[0])
    return Mix(entries)
