"""Multi-view training (MV-GRPO): extra captions per prompt group, the same samples re-scored.

MV-GRPO (Bu et al. 2026, "From Sparse to Dense: Multi-View GRPO for Flow Models via Augmented
Condition Space", arXiv:2603.12648) densifies the reward signal without sampling more: a
condition enhancer (:mod:`flowgrpo.rl.enhancers`) gives each prompt group ``train.views`` extra
captions; the group's samples are re-scored under each caption, which gives rewards ``[B, V]``
(view 0 is the prompt itself, scored during the rollout) and advantages per view; the log-prob of
the original trajectory is then trained under each view's condition. No sample is regenerated:
a view costs one decode, one reward call and one prompt encoding per batch, and ``J`` replayed
steps (an old-policy forward and a training forward) per sample.
"""

from __future__ import annotations

import torch

from flowgrpo import seeding
from flowgrpo.rl import enhancers
from flowgrpo.rl.batch import RolloutBatch
from flowgrpo.rl.session import ModelSession, Score
from pipelines.base import LATENT_LENGTH


class Views:
    """Adds ``num_views`` enhanced views to each rollout batch (none when 0).

    Args:
        num_views: extra captions per prompt group (``train.views``).
        enhancer: a registered enhancer name and ``params`` its parameters.
        seed: the run seed; views of iteration ``t`` use the seed ``(seed, t)``.
    """

    def __init__(self, num_views: int, enhancer: str, params: dict, seed: int) -> None:
        self.num_views, self.seed = num_views, seed
        self.enhancer = enhancers.build(enhancer, **params) if num_views else None

    def captions(self, prompts: list[str], iteration: int) -> list[list[str]]:
        """``V`` lists of ``B`` captions: ``[prompts, view 1, ..., view num_views]``; the samples
        of one prompt share its views."""
        unique = sorted(set(prompts))
        extra = self.enhancer(unique, self.num_views,
                             seeding.stream_seed("views", self.seed, iteration))
        table = dict(zip(unique, extra))
        return [prompts] + [[table[p][v] for p in prompts] for v in range(self.num_views)]

    def extend(self, session: ModelSession, score: Score, batch: RolloutBatch,
               iteration: int) -> None:
        """Encode (``session``) and score (``score``, a synchronous reward call) every extra view
        of ``batch`` (in place: ``views``, ``view_rewards``)."""
        if not self.num_views:
            return
        captions = self.captions(batch.prompts, iteration)
        media = session.decode(batch.traj.final.float())
        lengths = batch.traj.cond.tensors.get(LATENT_LENGTH)
        for prompts in captions[1:]:
            view = session.encode(prompts, batch.metadata, cache=False)
            if lengths is not None and not torch.equal(view.tensors.get(LATENT_LENGTH), lengths):
                raise ValueError("train.views: a view's caption gives its samples other lengths "
                                 "than they were generated with (this family's length follows "
                                 "the text); give each prompt a 'duration' in its metadata")
            batch.views.append(view)
            batch.view_rewards.append(score(media, prompts, batch.metadata))
        batch.info["views/reward_spread"] = float(
            sum((o.scores.float() - batch.reward.scores.float()).abs().mean()
                for o in batch.view_rewards[1:]) / self.num_views)
