"""The trainer's side of rewards: build from config, run inline or in a worker pool, gather.

The trainer never looks at reward names: a mix of rewards is itself a reward whose output carries
per-component scores, which are logged as ``reward/<name>`` and, with the ``normalize_then_sum``
aggregation, normalized one by one before they are summed.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from pipelines import FlowAdapter
from reward_models import Media, RewardOutput

from .batch import cat_rewards
from .config import RewardConfig


class _Done(Future):
    """An already finished future (inline rewards)."""

    def __init__(self, value: RewardOutput) -> None:
        super().__init__()
        self.set_result(value)


class RewardRunner:
    """Scores decoded media with the configured reward.

    Args:
        cfg: the ``reward`` config section.
        adapter: the model adapter (its modality and sample rate describe the media).
    """

    def __init__(self, cfg: RewardConfig, adapter: FlowAdapter) -> None:
        from reward_models.mix import build_reward

        self.cfg = cfg
        self.reward = build_reward(cfg.specs())
        self.modality = adapter.modality
        self.sample_rate = adapter.sample_rate
        self.groupwise = bool(getattr(self.reward, "groupwise", False))
        # a mix exposes its top-level component keys and weights (nested parts are only logged)
        keys, weights = getattr(self.reward, "keys", None), getattr(self.reward, "weights", None)
        self.weights = dict(zip(keys, weights)) if keys and weights else None
        self.pool = None
        if cfg.async_workers:
            from reward_models.async_pool import AsyncReward

            self.pool = AsyncReward(self.reward, workers=cfg.async_workers)

    def media(self, data: torch.Tensor) -> Media:
        return Media(self.modality, data, self.sample_rate)

    def submit(self, data: torch.Tensor, prompts: list[str], metadata: list[dict]) -> Future:
        """Start scoring a chunk; returns a future of its :class:`RewardOutput`."""
        media = self.media(data.detach())
        if self.pool is not None:
            return self.pool.submit(media, prompts, metadata)
        return _Done(self.reward(media, prompts, metadata))

    def collect(self, pending: list[Future]) -> RewardOutput:
        """Wait for every chunk and concatenate in order."""
        return cat_rewards([f.result() for f in pending])

    def score(self, data: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        """Score a batch synchronously (eval)."""
        return self.reward(self.media(data.detach()), prompts, metadata)

    def for_advantages(self, signal, acc) -> torch.Tensor | dict:
        """What the advantage estimator gets from every process (``signal``: a credit's
        :class:`~flowgrpo.credit.Signal`; ``acc``: the accelerate ``Accelerator``): the scores,
        or the components when each reward is normalized on its own (``normalize_then_sum``)."""
        if self.cfg.aggregation == "normalize_then_sum" and self.weights and signal.components:
            return {k: acc.gather(signal.components[k].to(acc.device)).float().cpu()
                    for k in self.weights}
        return acc.gather(signal.scores.to(acc.device)).float().cpu()

    def metrics(self, out: RewardOutput, acc, prefix: str = "reward") -> dict:
        """``reward/mean``, ``reward/std`` and ``reward/<component>`` over all processes."""
        scores = acc.gather(out.scores.to(acc.device)).float()
        metrics = {f"{prefix}/mean": scores.mean().item(), f"{prefix}/std": scores.std().item()}
        for key, value in (out.components or {}).items():
            metrics[f"{prefix}/{key}"] = acc.gather(value.to(acc.device)).float().mean().item()
        for key, value in out.info.items():
            metrics[f"{prefix}/{key}"] = float(value)
        return metrics
