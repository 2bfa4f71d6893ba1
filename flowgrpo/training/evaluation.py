"""Evaluation: the deterministic (Euler) sampler on fixed prompts with fixed per-image seeds (a
discrete model: its sampler, each image drawn from its own fixed seed).

Each eval image ``i`` has its own seed, so its initial noise does not depend on the batch
layout or the number of processes; the same model gives the same eval images every time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F

import samplers
from flowgrpo.config.schema import Config
from flowgrpo.data.prompts import Prompt
from flowgrpo.rl.batch import chunks
from flowgrpo.rl.rollout import RolloutSpec, rollout, solve
from flowgrpo.rl.session import ModelSession
from flowgrpo.seeding import stream_seed
from flowgrpo.training.reward_runner import RewardRunner
from pipelines import Cond, FlowAdapter
from reward_models import RewardOutput


def eval_items(prompts: list[Prompt], per_prompt: int) -> list[tuple[str, dict, int]]:
    """``(prompt, metadata, seed)`` for every eval image, in a fixed order."""
    return [(p, {**m, "group": i}, stream_seed("eval_noise", i * per_prompt + j))
            for i, (p, m) in enumerate(prompts) for j in range(per_prompt)]


def fixed_noise(adapter: FlowAdapter, seeds: list[int], cond: Cond) -> torch.Tensor:
    """Initial latents of the images encoded as ``cond``, one generator per image
    (batch-independent)."""
    gens = [torch.Generator(adapter.device).manual_seed(seed) for seed in seeds]
    return adapter.initial_noise(gens, cond)


@torch.no_grad()
def generate(
    adapter: FlowAdapter,
    encode: Callable[[list[str], list[dict]], Cond],
    prompts: list[str],
    seeds: list[int],
    num_steps: int,
    guidance: float,
    batch_size: int,
    sampler: samplers.Sampler | None = None,
    autocast: Callable = nullcontext,
    metadata: list[dict] | None = None,
) -> torch.Tensor:
    """Decoded media for ``prompts`` (one seed each, with their ``metadata``, which ``encode``
    reads for image-conditioned families); Euler (:func:`solve`) unless a stochastic
    ``sampler`` is given (then every step but the last is stochastic).

    A discrete model has no deterministic solve: it samples with ``sampler`` (required), each
    image's steps drawn from its own generator seeded from its seed, so an image does not depend
    on its batch-mates or the number of processes (fixed-seed sampling, not argmax: the argmax
    of a masked step would keep every token masked)."""
    sigmas = adapter.schedule(num_steps)
    space = adapter.state_space
    if sampler is not None:
        sampler.bind(adapter)
    elif not space.deterministic_eval:
        raise ValueError(f"a {space.name} model is evaluated by sampling: pass its sampler")
    metadata = metadata if metadata is not None else [{} for _ in prompts]
    out = []
    for sl in chunks(len(prompts), batch_size):
        cond = encode(prompts[sl], metadata[sl])
        noise = fixed_noise(adapter, seeds[sl], cond)
        if sampler is None or not sampler.is_stochastic:
            final = solve(adapter, noise, sigmas, cond, guidance, autocast=autocast)
        elif space.random_every_step:  # every step a draw from the image's own stream
            gens = [torch.Generator(adapter.device).manual_seed(stream_seed("image_steps", seed))
                    for seed in seeds[sl]]
            none = torch.zeros(len(noise), 0, dtype=torch.long)
            final = rollout(adapter, RolloutSpec(sampler, guidance, autocast=autocast), cond,
                            noise, sigmas, none, generator=gens).final
        else:
            # the chunk's step noise: from its first image's seed (a stream seed already)
            gen = torch.Generator(adapter.device).manual_seed(seeds[sl][0])
            trained = torch.arange(num_steps - 1).expand(len(noise), -1)
            final = rollout(adapter, RolloutSpec(sampler, guidance, autocast=autocast), cond,
                            noise, sigmas, trained, generator=gen).final
        out.append(adapter.decode(final))
    if adapter.modality == "audio":  # chunks of per-prompt lengths: silence after the shorter
        longest = max(m.shape[-1] for m in out)
        out = [F.pad(m, (0, longest - m.shape[-1])) if m.shape[-1] < longest else m
               for m in out]
    return torch.cat(out)


class Evaluator:
    """Eval reward of the current weights on ``prompts`` (shared by training and the CLI).

    Args:
        session: the model session (adapter, prompt encoding, autocast, guidance).
        acc: the accelerate ``Accelerator`` (each process takes every world-th image).
        tracker: where the eval grid is saved (optional).
        ema: weights swapped in during eval (optional).
        encode: encodes prompts in place of ``session.encode`` (the CLI encodes each chunk in
            one adapter call).
        sampler: the run's sampler, which a discrete model is evaluated with (default: built
            from ``cfg.sampler``); a continuous model is evaluated with the Euler ODE.
    """

    def __init__(self, cfg: Config, session: ModelSession, rewards: RewardRunner,
                 prompts: list[Prompt], acc, tracker=None, ema=None,
                 encode: Callable | None = None,
                 sampler: samplers.Sampler | None = None) -> None:
        self.cfg, self.session, self.rewards = cfg, session, rewards
        self.adapter, self.encode = session.adapter, encode or session.encode
        self.acc, self.tracker, self.ema = acc, tracker, ema
        self.items = eval_items(prompts, cfg.data.eval_images_per_prompt)
        self.sampler = None
        if not self.adapter.state_space.deterministic_eval:
            self.sampler = (sampler or samplers.build(cfg.sampler.name, **cfg.sampler.params)
                            ).bind(self.adapter)

    def run(self, step: int) -> dict:
        """``eval/reward`` (and ``eval/<component>``) over all processes; saves a grid."""
        cfg, acc = self.cfg, self.acc
        mine = self.items[acc.process_index::acc.num_processes]
        prompts = [p for p, _, _ in mine]
        with self.ema.applied() if self.ema is not None else nullcontext():
            media = generate(self.adapter, self.encode, prompts, [s for _, _, s in mine],
                             cfg.sampler.eval_num_steps or cfg.sampler.num_steps,
                             self.session.guidance,
                             cfg.train.sample_batch_size or cfg.train.batch_size,
                             sampler=self.sampler, autocast=self.session.autocast,
                             metadata=[m for _, m, _ in mine])
        per_prompt = cfg.data.eval_images_per_prompt  # chunks keep a prompt's images together
        out = RewardOutput.cat([
            self.rewards.score(media[sl], prompts[sl], [m for _, m, _ in mine[sl]])
            for sl in chunks(len(mine), max(64 // per_prompt, 1) * per_prompt)])
        # shards may differ in size: reduce sums and counts, not the scores themselves
        parts = {"reward": out.scores, **(out.components or {})}
        sums = torch.tensor([float(v.sum()) for v in parts.values()] + [float(len(mine))],
                            device=acc.device)
        if acc.num_processes > 1:
            sums = acc.reduce(sums, reduction="sum")
        metrics = {f"eval/{k}": (sums[i] / sums[-1]).item() for i, k in enumerate(parts)}
        if self.tracker is not None:  # labeled: each row's prompt, each sample's reward
            self.tracker.save_media(step, "eval", media, self.adapter.modality,
                                    self.adapter.sample_rate, nrow=per_prompt, prompts=prompts,
                                    scores=out.scores)
        return metrics
