"""Objectives: what the trainer minimises for one rollout batch (registry ``train.objective``).

An objective says what it needs from a rollout (:attr:`Objective.needs_transitions`), prepares
per-batch state before the first update (:meth:`Objective.prepare`, e.g. old log-probs), lists
its training units (:meth:`Objective.units`) and returns ``(loss, metrics)`` for one minibatch of
samples and one unit (:meth:`Objective.loss`). The trainer's update is one generic loop over
minibatches and units: accumulate, sync, clip, step. A new method is a new objective, never a
branch in that loop.

Advantages reach an objective as ``batch.advantages`` ``[B, V, J, P]``: per view ``V`` (MV-GRPO;
1 without views), per trained step ``J`` (TurningPoint-GRPO; an outcome advantage is broadcast
over the steps) and per region ``P`` (SpatialFlow-GRPO; 1 without regions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

import samplers
from flowgrpo import seeding
from flowgrpo.registry import Registry
from flowgrpo.rl import kl as kl_lib
from flowgrpo.rl import losses
from flowgrpo.rl.batch import RolloutBatch, chunks
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.session import ModelSession
from flowgrpo.validation import integer, one_of
from pipelines import FlowAdapter

OBJECTIVES: Registry[type[Objective]] = Registry("objective")


@dataclass
class Policy:
    """What an objective may call: the model session, the sampler and the run's loss settings.

    Attributes:
        session: the model session (its adapter's transformer is the trained policy; its
            guidance is the CFG scale of rollout and training; its autocast wraps model calls).
        sampler: the rollout's stochastic sampler.
        loss: the policy loss name (losses registry) and ``loss_params`` its parameters.
        beta: KL weight against the reference (0: no reference calls).
        batch_size: samples per no-grad forward when recomputing state.
        kl: the KL estimator's name (:mod:`flowgrpo.rl.kl`; ``""``: the objective's default).
        params: the trainable parameters (objectives that keep snapshots of them).
        seed: the run seed (objectives that draw noise).
    """

    session: ModelSession
    sampler: samplers.Sampler
    loss: str = "clip"
    loss_params: dict = field(default_factory=dict)
    beta: float = 0.0
    batch_size: int = 32
    kl: str = ""
    params: list = field(default_factory=list)
    seed: int = 0

    @property
    def adapter(self) -> FlowAdapter:
        return self.session.adapter

    @property
    def guidance(self) -> float:
        return self.session.guidance

    @property
    def autocast(self) -> Callable:
        return self.session.autocast


class Objective:
    """Base class. Subclasses take their own parameters as keyword arguments after ``policy``.

    Attributes:
        needs_transitions: whether the objective replays the rollout's per-step transitions
            (stored latents and sampling log-probs of the trained steps), or only needs final
            samples (then rollouts may be deterministic: ``sampler.name: ode``).
        kl_estimators: the KL estimators it can feed (:mod:`flowgrpo.rl.kl`); the first is the
            default.
        state_space: the state space it trains (None: either); the config refuses a sampler of
            another kind.
        anchored: whether it compares the policy with an old policy or a reference (a ratio, an
            old velocity or a preference margin), so that the contract "ratio 1 (or its
            analogue) before the first update" applies; SFT has neither.
    """

    needs_transitions: ClassVar[bool] = True
    # the kind of state it trains (samplers.spaces); None: any (the ratio objective)
    state_space: ClassVar[samplers.StateSpace | None] = None
    kl_estimators: ClassVar[tuple[str, ...]] = ("exact", "flow_grpo", "x_mse")
    anchored: ClassVar[bool] = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.kl = kl_lib.get(policy.kl or self.kl_estimators[0]) if policy.beta > 0 else None

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Within the block the model is the sampling policy (default: the trained weights)."""
        yield

    def after_update(self) -> None:
        """Called once after each iteration's updates (e.g. to move an old-policy snapshot)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors to checkpoint (snapshots); empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict` (a resumed run continues the same snapshots)."""

    def prepare(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> Any:
        """Per-batch state, computed before the first update (under the sampling policy) for the
        samples ``rows`` that will be trained (None: all); other rows may be left unset."""
        return None

    def units(self, batch: RolloutBatch) -> list:
        """The training units each minibatch of samples is trained on, in order."""
        raise NotImplementedError

    def loss(self, batch: RolloutBatch, state: Any, idx: torch.Tensor,
             unit: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(scalar loss, metrics)`` of samples ``idx`` on ``unit`` (with gradient)."""
        raise NotImplementedError


@OBJECTIVES.register("ratio")
class RatioObjective(Objective):
    """Flow-GRPO's per-step Gaussian ratio with a registered policy loss (``train.loss``).

    Units are ``(view, trained step)`` pairs. For each, the step is replayed with gradient under
    the view's condition, ``ratio = exp(logp - logp_old)`` and
    ``loss = policy(logp, logp_old, A * w) + beta * mean(KL)``, ``w`` the step selection's loss
    weight. ``logp`` is per region (``[b, P]``) when the reward returns regions.

    Old log-probs: the rollout's own when there is one view, no regions and the rollout's
    guidance; otherwise they are recomputed before the first update under each view's condition,
    region maps and the training guidance, so the ratio is exactly 1 before the first update in
    every case.

    Args:
        steps_per_call: trained steps replayed together in one transformer call (stacked along
            the batch: ``steps_per_call * b`` rows), with one backward for them. The loss is the
            same mean over steps; fewer, larger calls use a GPU better when memory allows. On
            CPU the stacked call gives the same values row for row (the ratio is 1 before the
            first update, tested); on GPU kernels that depend on the batch size it may differ in
            the last bits.
        guidance: CFG scale of the replayed steps (None: the rollout's ``model.guidance``).
            CFG-free training (FlowTTS-GRPO): the rollout samples with CFG and ``guidance: 1``
            replays each stored transition ``x_k -> x_{k+1}`` under the unguided model. The
            sampling-time log-probs belong to the guided policy, so they are recomputed under
            the unguided one before the first update: the ratio is exactly 1 there and measures
            how far the unguided policy moves during the update; the guided rollout only decides
            which transitions are trained on (no importance correction between the two; see
            ``old_log_probs: bypass`` for the corrected alternative).
        old_log_probs: where PPO's old log-probs come from (rollout correction, after verl's
            rollout-correction modes, volcengine/verl ``docs/algo/rollout_corr.md`` at b54386e;
            verl-omni reports the recompute at about 20% of a step):

            * ``auto`` (default): the rollout's own when the training conditions are the
              rollout's (one view, no regions, the rollout's guidance), else recomputed;
            * ``recompute``: always recomputed before the first update (one no-grad call per
              sample, view and trained step): the ratio is exactly 1 there in every case;
            * ``bypass``: never recomputed: the old policy is the rollout's (verl's bypass mode,
              ``bypass_ppo_clip``: PPO clip against the behaviour log-probs; its REINFORCE
              variant with explicit truncated weights is not offered here, since the policy
              losses already bound the ratio). Under the rollout's conditions this is
              ``auto`` exactly; where they differ (CFG-free training, views, regions) the ratio
              at the first update is the importance ratio ``pi_train / pi_rollout`` of the
              stored transition, and the policy loss's trust region bounds it. No calls are
              spent on old log-probs;
            * ``reject``: ``bypass`` plus masked importance sampling: a sample's step whose
              importance ratio (detached, at the time it is trained) lies outside
              ``[1 / reject_bound, reject_bound]`` is left out of the loss (verl's
              ``rollout_rs: token_k1`` with the lower bound the upper's reciprocal; its IS
              threshold default 2).
              ``train/rejected_frac`` logs the share left out.
        reject_bound: the ``reject`` bound, > 1.
        kl_steps: 0 (default): the KL term at every trained step (one reference call per
            sample and step); ``n``: at ``n`` of the ``J`` trained steps, drawn per iteration
            from the run seed (the same on every process), each scaled by ``J / n``, so the
            term (and ``train/kl``) is an unbiased estimate of the every-step mean at ``n / J``
            of the reference calls. Needs ``steps_per_call: 1``.
    """

    OLD_LOG_PROBS = ("auto", "recompute", "bypass", "reject")

    def __init__(self, policy: Policy, steps_per_call: int = 1,
                 guidance: float | None = None, old_log_probs: str = "auto",
                 reject_bound: float = 2.0, kl_steps: int = 0) -> None:
        super().__init__(policy)
        integer("kl_steps", kl_steps, 0)
        if kl_steps and steps_per_call > 1:
            raise ValueError("kl_steps draws single steps: use it with steps_per_call: 1")
        self.kl_steps = kl_steps
        self.kl_at: set[int] | None = None  # the iteration's KL steps (None: every step)
        integer("steps_per_call", steps_per_call, 1)
        if guidance is not None and not float(guidance) >= 0:
            raise ValueError(f"guidance must be >= 0, got {guidance!r}")
        one_of("old_log_probs", old_log_probs, self.OLD_LOG_PROBS)
        if not (math.isfinite(float(reject_bound)) and float(reject_bound) > 1):
            raise ValueError(f"reject_bound must be a finite number > 1, got {reject_bound!r}")
        self.steps_per_call = steps_per_call
        self.guidance = policy.guidance if guidance is None else float(guidance)
        self.old_log_probs, self.reject_bound = old_log_probs, float(reject_bound)

    def prepare(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, V, J, P]`` old log-probs (and the iteration's KL steps, ``kl_steps > 0``)."""
        traj = batch.traj
        num = traj.num_trained
        if self.kl_steps and self.kl is not None and self.kl_steps < num:
            gen = seeding.generator("kl_steps", self.policy.seed, batch.iteration)
            self.kl_at = set(torch.randperm(num, generator=gen)[:self.kl_steps].tolist())
        else:
            self.kl_at = None
        if self.old_log_probs in ("bypass", "reject"):
            if batch.regions is not None:
                raise ValueError(f"old_log_probs: {self.old_log_probs} has no rollout log-prob "
                                 "per region (the rollout's is the whole sample's): use auto "
                                 "or recompute with a region reward")
            return traj.log_probs[:, None, :, None].expand(batch.advantages.shape)
        if (self.old_log_probs == "auto" and len(batch.views) == 1 and batch.regions is None
                and self.guidance == self.policy.guidance):
            return traj.log_probs[:, None, :, None]
        out = torch.zeros(batch.advantages.shape, device=traj.log_probs.device)
        for v in range(len(batch.views)):
            for j in range(traj.num_trained):
                fill(out[:, v, j], batch, rows, self.policy.batch_size,
                     lambda idx, v=v, j=j: self.replay(batch, idx, v, j, kl=None).log_prob)
        return out

    def units(self, batch: RolloutBatch) -> list[tuple[int, int]]:
        """``(view, step)``; with ``steps_per_call > 1``, ``(view, (steps...))`` in groups."""
        num, per = batch.traj.num_trained, self.steps_per_call
        if per == 1:
            return [(v, j) for v in range(len(batch.views)) for j in range(num)]
        return [(v, tuple(range(j, min(j + per, num))))
                for v in range(len(batch.views)) for j in range(0, num, per)]

    def replay(self, batch: RolloutBatch, idx: torch.Tensor, v: int, j: int, kl):
        p = self.policy
        return replay_step(p.adapter, p.sampler, batch.traj, idx, j, self.guidance,
                           kl=kl, regions=batch.regions, autocast=p.autocast,
                           cond=batch.views[v])

    def loss(self, batch, state, idx, unit):
        v, j = unit
        sampled = self.kl_at is None or j in self.kl_at
        result = self.replay(batch, idx, v, j, kl=self.kl if sampled else None)
        if not isinstance(j, tuple):
            kl = result.kl
            if kl is not None and self.kl_at is not None:  # unbiased: J / n per drawn step
                kl = kl * (batch.traj.num_trained / len(self.kl_at))
            return self.step_loss(batch, state, idx, v, j, result.log_prob, kl)
        # stacked steps: the trainer weighs each unit 1 / len(units); each step keeps the weight
        # 1 / (views * steps) it has unstacked, also when the last unit holds fewer steps
        n, num = len(idx), batch.traj.num_trained
        share = math.ceil(num / self.steps_per_call) / num
        parts = [self.step_loss(batch, state, idx, v, step, result.log_prob[i * n:(i + 1) * n],
                                None if result.kl is None else result.kl[i * n:(i + 1) * n])
                 for i, step in enumerate(j)]
        loss = sum(part[0] for part in parts) * share
        metrics = {}
        for key in parts[0][1]:
            values = torch.stack([part[1][key] for part in parts])
            metrics[key] = (values.min() if key.endswith("_min") else values.max()
                            if key.endswith("_max") else values.mean())
        return loss, metrics

    def step_loss(self, batch, state, idx, v, j, log_prob, kl):
        """Loss and metrics of samples ``idx`` at view ``v`` and trained step ``j``."""
        p = self.policy
        logp = log_prob.reshape(len(idx), -1)
        weight = batch.sample_weights[idx].to(logp.device)
        adv = batch.advantages[idx, v, j] * (batch.step_weights[idx, j].to(logp.device)
                                             * weight)[:, None]
        old = state[idx, v, j].reshape(logp.shape).to(logp.device)
        rejected = None
        if self.old_log_probs == "reject":
            ratio = torch.exp(logp.detach() - old)
            rejected = (ratio > self.reject_bound) | (ratio < 1 / self.reject_bound)
            adv = torch.where(rejected, torch.zeros_like(adv), adv)
        loss, metrics = losses.get(p.loss)(logp.flatten(), old.flatten(), adv.flatten(),
                                           **p.loss_params)
        if rejected is not None:
            metrics["train/rejected_frac"] = rejected.float().mean()
        return add_kl(loss, metrics, kl, weight, p.beta)


@torch.no_grad()
def fill(out: torch.Tensor, batch: RolloutBatch, rows: torch.Tensor | None, size: int,
         compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``out[idx] = compute(idx)`` (reshaped to ``out[idx]``'s shape) without gradient, for the
    sample indices ``rows`` (None: every sample) in chunks of ``size``: recomputing per-sample
    state under the sampling policy. Returns ``out``."""
    rows = torch.arange(len(batch.groups)) if rows is None else rows.cpu()
    for sl in chunks(len(rows), size):
        idx = rows[sl]
        out[idx.to(out.device)] = compute(idx).reshape(len(idx), *out.shape[1:]).to(out.dtype)
    return out


def add_kl(loss: torch.Tensor, metrics: dict, kl: torch.Tensor | None, weight: torch.Tensor,
           beta: float) -> tuple[torch.Tensor, dict]:
    """``loss + beta * mean(weight * kl)`` with ``train/kl`` and ``train/loss`` metrics; ``weight``
    is the samples' importance weight (1 unless pruned)."""
    if kl is not None:
        kl = (kl * weight).mean()
        metrics["train/kl"] = kl.detach()
        loss = loss + beta * kl
    metrics["train/loss"] = loss.detach()
    return loss, metrics


def build(name: str, policy: Policy, **params: Any) -> Objective:
    """The objective registered as ``name``, bound to ``policy``, with its parameters."""
    return OBJECTIVES.build(name, policy, **params)


# the likelihood-free objectives register themselves here
