"""Likelihood-free objectives: trained on final samples through the forward (noising) process.

They never replay the rollout's per-step transitions (``needs_transitions = False``), so rollouts
may use the deterministic ODE (``sampler.name: ode``) or any solver. Each iteration draws, per
sample, ``K`` noise levels and noises ``(t_k, eps_k)`` (:class:`Draws`, fixed per sample and
iteration and stored with the batch state, so the old and the new policy see the same draws) and
forms ``x_t = (1 - t) x0 + t eps`` from the final sample ``x0``; the flow-matching target is
``u = eps - x0`` and the velocity error ``e = v_theta(x_t, t, c) - u``.

Weightings of the squared error (``weighting``), as log-likelihood proxies ``lp(e, t)``:

============ ====================================================== ============================
name         ``lp``                                                 source
============ ====================================================== ============================
uniform      ``-mean(e^2)``                                         the flow-matching loss
x0           ``-t^2 mean(e^2)`` (= ``-mean((x0_hat - x0)^2)``)      ELBO paper's "t"
adaptive     ``-t mean(e^2) / sg(mean|e|)`` (= ``-mean((x0_hat -    DiffusionNFT, ELBO paper
             x0)^2) / sg(mean|x0_hat - x0|)``)                      (their default)
ghuber       ``-((mean(e^2) + 1e-10)^p - 1e-10^p) t / p``           AWM (p = 0.25)
============ ====================================================== ============================

(``x0_hat - x0 = t (u - v)``, so the x0-space forms are these velocity-space ones.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flowgrpo import seeding
from flowgrpo.rl import losses
from flowgrpo.rl.batch import RolloutBatch
from flowgrpo.rl.ema import EMA
from flowgrpo.rl.kl import KLInputs
from flowgrpo.rl.objectives.base import OBJECTIVES, Objective, Policy, add_kl, fill
from flowgrpo.rl.reference import reference
from flowgrpo.rl.rollout import model_velocity
from flowgrpo.validation import integer, one_of
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT
from samplers import CONTINUOUS

TIMESTEPS = ("uniform", "logit_normal")
WEIGHTINGS = ("uniform", "x0", "adaptive", "ghuber")


@dataclass
class Draws:
    """``t [B, K]`` noise levels and ``noise [B, K, ...]`` standard normals, one per draw."""

    t: torch.Tensor
    noise: torch.Tensor


def draw(x0: torch.Tensor, k: int, timesteps: str,
         generator: torch.Generator | list[torch.Generator],
         t_range: tuple[float, float] = (0.02, 0.98),
         lengths: torch.Tensor | None = None) -> Draws:
    """``K`` draws per sample: ``t`` uniform in ``t_range`` or logit-normal (``sigmoid(N(0,
    1))``, SD3's training density, clamped to ``t_range``), noise standard normal. With a list
    of generators, sample ``i`` draws from ``generator[i]`` alone; with its ``lengths[i]``
    (the condition's :data:`~pipelines.base.LATENT_LENGTH`), at that length along the sample's
    dim 1, zero after it (the draws of a batch of that length alone)."""
    if isinstance(generator, (list, tuple)):
        parts = [draw(x0[i:i + 1] if lengths is None else x0[i:i + 1, :int(lengths[i])], k,
                      timesteps, g, t_range) for i, g in enumerate(generator)]
        noise = [p.noise for p in parts]
        if lengths is not None:  # [1, K, n, ...] -> [1, K, T, ...]
            noise = [F.pad(z, (0, 0) * (z.dim() - 3) + (0, x0.shape[1] - z.shape[2]))
                     for z in noise]
        return Draws(torch.cat([p.t for p in parts]), torch.cat(noise))
    b = x0.shape[0]
    if timesteps == "uniform":
        t = t_range[0] + (t_range[1] - t_range[0]) * torch.rand(b, k, generator=generator)
    else:
        t = torch.sigmoid(torch.randn(b, k, generator=generator)).clamp(*t_range)
    noise = torch.randn(b, k, *x0.shape[1:], generator=generator)
    return Draws(t.to(x0.device), noise.to(x0.device))


def weighted_lp(err: torch.Tensor, t: torch.Tensor, weighting: str,
                power: float = 0.25, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``lp [n]`` from velocity errors ``err [n, ...]`` at noise levels ``t [n]`` (see the module
    table); float32. With a per-position ``weight`` (the condition's ``LOGPROB_WEIGHT``,
    broadcastable to ``err``) every ``mean`` is ``mean(weight * ...)``, as the log-prob's."""
    flat = err.float().flatten(1)
    w = None if weight is None else weight.float().expand_as(err).reshape(flat.shape)
    mse = (flat * flat).mean(1) if w is None else (flat * flat * w).mean(1)
    if weighting == "uniform":
        return -mse
    if weighting == "x0":
        return -(t * t) * mse
    if weighting == "adaptive":
        size = flat.abs().mean(1) if w is None else (flat.abs() * w).mean(1)
        scale = (t * size).detach().clamp_min(1e-5)
        return -(t * t) * mse / scale
    return -((mse + 1e-10) ** power - 1e-10**power) * t / power


class ForwardObjective(Objective):
    """Shared machinery: draws, forward-noised velocities, the reference's velocities.

    Args:
        draws: ``K``, noise draws per sample and iteration.
        timesteps: ``uniform`` or ``logit_normal`` density of ``t``.
        weighting: ``uniform``, ``x0``, ``adaptive`` or ``ghuber`` (module table).
        power: ``ghuber``'s exponent ``p``.
        guidance: CFG scale of the training forwards (None: the run's ``model.guidance``; 1:
            CFG-free training, e.g. when rollouts use CFG but training should not).

    Both ``elbo`` and ``awm`` take ``old_log_probs``: ``recompute`` (default) computes the old
    log-likelihoods on the stored draws before the first update (one no-grad call per sample and
    draw); ``on_policy`` takes them from the training forward itself, detached (UDM-GRPO's
    ``exp(lp - sg(lp))``), so the ratio is 1 at every minibatch and no call is spent on them.
    When each sample is trained in one optimizer step (one minibatch, ``num_inner_epochs: 1``,
    the toy's layout) the two give the same update; with several minibatches ``on_policy``
    drops the trust region of the later ones (a plain on-policy gradient per minibatch).
    """

    needs_transitions = False
    state_space = CONTINUOUS  # Gaussian forward noising of latents
    kl_estimators = ("velocity_mse", "log_ratio")

    def __init__(self, policy: Policy, draws: int = 4, timesteps: str = "uniform",
                 weighting: str = "adaptive", power: float = 0.25,
                 guidance: float | None = None) -> None:
        super().__init__(policy)
        integer("draws", draws, 1)
        one_of("timesteps", timesteps, TIMESTEPS)
        one_of("weighting", weighting, WEIGHTINGS)
        if not power > 0:
            raise ValueError(f"power must be > 0, got {power}")
        self.k, self.timesteps, self.weighting, self.power = draws, timesteps, weighting, power
        self.guidance = policy.guidance if guidance is None else float(guidance)
        self.lp_scale = 1.0  # a constant factor of every log-likelihood (elbo's cfg_division)
        self.adv_scale = 1.0  # a constant factor of the advantages (awm's adv_scale)

    def lp(self, err: torch.Tensor, t: torch.Tensor,
           weight: torch.Tensor | None = None) -> torch.Tensor:
        """``[n]`` log-likelihood proxies of velocity errors ``err [n, ...]`` (module table),
        times :attr:`lp_scale`; ``weight`` as :func:`weighted_lp`'s."""
        out = weighted_lp(err, t, self.weighting, self.power, weight)
        return out if self.lp_scale == 1.0 else out * self.lp_scale

    def position_weight(self, batch: RolloutBatch, idx: torch.Tensor,
                        k: torch.Tensor | None = None) -> torch.Tensor | None:
        """The condition's ``LOGPROB_WEIGHT`` of the rows :meth:`velocities` returns for
        samples ``idx`` and draws ``k`` (None when the family has none)."""
        weight = batch.traj.cond.tensors.get(LOGPROB_WEIGHT)
        if weight is None:
            return None
        ks = self.k if k is None else k.numel()
        return weight[idx.to(weight.device).repeat_interleave(ks)]

    def draws(self, batch: RolloutBatch) -> Draws:
        # one stream per sample, keyed by its global index: the same on any number of processes
        gens = [seeding.generator("objective_draws", self.policy.seed, batch.iteration, i)
                for i in batch.index.tolist()]
        lengths = batch.traj.cond.tensors.get(LATENT_LENGTH)
        return draw(batch.traj.final.float().cpu(), self.k, self.timesteps, gens,
                    lengths=None if lengths is None else lengths.cpu())

    def velocities(self, batch: RolloutBatch, draws: Draws, idx: torch.Tensor,
                   k: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``(v, u, t)`` for samples ``idx`` and draws ``k`` (all ``K`` when None): the policy's
        velocity at ``x_t`` (grad when enabled), the target and ``t``, each flattened to
        ``[b * K', ...]``."""
        device = batch.traj.latents.device
        rows = idx.to(device)
        ks = torch.arange(self.k) if k is None else k.reshape(-1).cpu()
        x0 = batch.traj.final[rows].float()
        t = draws.t[rows][:, ks].to(device)
        eps = draws.noise[rows][:, ks].to(device).float()
        x0 = x0[:, None].expand_as(eps)
        tb = t.reshape(*t.shape, *([1] * (eps.ndim - 2)))  # [b, K', 1, ..., 1]
        xt = (1 - tb) * x0 + tb * eps
        flat = (-1, *x0.shape[2:])
        cond = batch.traj.cond.index(idx.repeat_interleave(len(ks)))
        p = self.policy
        v = model_velocity(p.adapter, cond, self.guidance, p.autocast)(
            xt.reshape(flat), t.reshape(-1))
        u = (eps - x0).reshape(flat)
        weight = cond.tensors.get(LOGPROB_WEIGHT)
        if weight is not None:  # positions the model does not generate carry no error
            v = torch.where(weight.to(v.device) > 0, v, u)
        return v, u, t.reshape(-1)

    def log_likelihoods(self, batch, draws, idx, k=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lp [b, K'], v)``: the weighted log-likelihood proxy of every draw."""
        v, u, t = self.velocities(batch, draws, idx, k)
        weight = self.position_weight(batch, idx, k)
        return self.lp(v - u, t, weight).reshape(len(idx), -1), v

    def old_log_likelihoods(self, batch: RolloutBatch, draws: Draws,
                            rows: torch.Tensor | None) -> torch.Tensor:
        """``[B, K]`` under the sampling policy, before any update (for ``rows``)."""
        out = torch.zeros(len(batch.groups), self.k, device=batch.traj.latents.device)
        return fill(out, batch, rows, self.policy.batch_size,
                    lambda idx: self.log_likelihoods(batch, draws, idx)[0])

    def kl_term(self, batch, draws, idx, k, v, logp):
        """``[b]`` KL estimate against the reference on the same draws (None without a KL
        term): ``v`` the policy's velocities, ``logp`` its log-likelihoods (mean over draws)."""
        if self.kl is None:
            return None
        with torch.no_grad(), reference(self.policy.adapter):
            ref_v, u, t = self.velocities(batch, draws, idx, k)
        weight = self.position_weight(batch, idx, k)
        ref_lp = self.lp(ref_v - u, t, weight).reshape(len(idx), -1)
        if weight is not None:
            weight = weight.to(v.device).expand_as(v).reshape(len(idx), -1)
        return self.kl(KLInputs(v=v.reshape(len(idx), -1), ref_v=ref_v.reshape(len(idx), -1),
                                logp=logp, ref_logp=None if logp is None else ref_lp.mean(1),
                                weight=weight))

    def ratio_loss(self, batch, draws, logp_old, idx, k=None, anchor=None, anchor_beta=0.0):
        """The run's policy loss on ``exp(logp - logp_old)``, ``logp`` the mean log-likelihood
        over draws ``k`` (all when None), plus ``beta`` times the KL (``elbo``, ``awm``), plus
        ``anchor_beta * mean ||v - anchor||^2`` when ``anchor`` (velocities ``[b * K', ...]``,
        e.g. an EMA's) is given. ``logp_old`` None: the detached ``logp`` itself
        (``old_log_probs: on_policy``)."""
        p = self.policy
        lp, v = self.log_likelihoods(batch, draws, idx, k)
        logp = lp.mean(1)
        if logp_old is None:  # old_log_probs: on_policy
            logp_old = logp.detach()
        weight = batch.sample_weights[idx].to(logp.device)
        adv = _advantage(batch, idx).to(logp.device) * self.adv_scale
        loss, metrics = losses.get(p.loss)(logp, logp_old.to(logp.device), adv * weight,
                                           **p.loss_params)
        if anchor is not None:
            pull = ((v.float() - anchor.to(v.device).float()) ** 2).flatten(1).mean(1)
            pull = (pull.reshape(len(idx), -1).mean(1) * weight).mean()
            metrics["train/ema_pull"] = pull.detach()
            loss = loss + anchor_beta * pull
        kl = self.kl_term(batch, draws, idx, k, v, logp)
        return add_kl(loss, metrics, kl, weight, p.beta)


def _old_log_probs(mode: str) -> bool:
    """Whether ``old_log_probs`` (``recompute`` or ``on_policy``) recomputes them."""
    one_of("old_log_probs", mode, ("recompute", "on_policy"))
    return mode == "recompute"


def _advantage(batch: RolloutBatch, idx: torch.Tensor) -> torch.Tensor:
    """``[b]`` outcome advantages (views, steps and regions are not used by these objectives)."""
    return batch.advantages[idx].reshape(len(idx), -1)[:, 0]


class LaggedCopy:
    """An EMA copy of the trainable weights on a warm-up schedule, moved once per iteration:
    ``copy <- eta copy + (1 - eta) theta`` with ``eta = min(rate * n, max)``, ``n`` the
    iterations done less ``delay`` (0 while negative). It starts equal to the weights.

    This is the schedule of DiffusionNFT's old policy (NVlabs/DiffusionNFT
    ``scripts/train_nft_sd3.py`` ``return_decay``, commit 24af555), of the ELBO paper's old
    policy (jaemoo-choi/rethinking-diffusion-rl ``src/utils/__init__.py`` ``return_decay``, commit
    c257000) and of AWM's EMA anchor (scxue/advantage_weighted_matching
    ``scripts/train_sd3_awm.py``, ``kl_ema_decay_type: linear``, commit be51372). The authors
    count ``n`` in optimizer steps; their configs take one optimizer step per epoch, where the
    two agree; here ``n`` counts iterations, the same on any batch layout.
    """

    def __init__(self, params: list[torch.nn.Parameter], rate: float, max_decay: float,
                 delay: int, owner: str) -> None:
        if not (0 <= rate and 0 <= max_decay < 1 and delay >= 0):
            raise ValueError(f"{owner} needs decay_rate >= 0, 0 <= decay_max < 1, "
                             f"decay_delay >= 0; got {rate}, {max_decay}, {delay}")
        self.rate, self.max, self.delay = rate, max_decay, delay
        self.ema = EMA(params, 0.0)
        self.iterations = 0

    def applied(self):
        """Within the block the parameters hold the copy (:meth:`EMA.applied`)."""
        return self.ema.applied()

    def step(self) -> None:
        self.iterations += 1
        n = max(self.iterations - self.delay, 0)
        self.ema.decay = min(self.rate * n, self.max)
        self.ema.update()

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        return {**{f"{prefix}.{k}": v for k, v in self.ema.state_dict().items()},
                "iterations": torch.tensor(self.iterations)}

    def load_state_dict(self, state: dict[str, torch.Tensor], prefix: str) -> None:
        cut = len(prefix) + 1
        self.ema.load_state_dict({k[cut:]: v for k, v in state.items()
                                  if k.startswith(prefix + ".")})
        self.iterations = int(state["iterations"])


@OBJECTIVES.register("elbo")
class ElboObjective(ForwardObjective):
    """ELBO likelihood (Choi et al. 2026, "Rethinking the Design Space of Reinforcement Learning
    for Diffusion Models: On the Importance of Likelihood Estimation Beyond Loss Design",
    arXiv:2602.04663; code jaemoo-choi/rethinking-diffusion-rl ``src/utils/__init__.py``
    ``compute_elbo``).

    ``log p(x0) ~ -mean_k w(t_k) ||v_theta(x_t, t_k, c) - (eps_k - x0)||^2`` over the ``K``
    stored draws (module docstring), then any registered policy loss (``train.loss``) on
    ``ratio = exp(logp - logp_old)``; ``logp_old`` is computed on the same draws before the first
    update, so the ratio is exactly 1 there. One training unit per minibatch: the ``K`` draws run
    as one batched model call. The authors take one draw per unit from the sampler's own grid and
    their adaptive weighting; here ``K`` draws are averaged into one log-likelihood (the
    estimator's variance falls like ``1/K``; tested), ``t`` is uniform by default, and the
    weighting is theirs (``adaptive``) by default.

    Two options reproduce the authors' code (jaemoo-choi/rethinking-diffusion-rl, commit c257000);
    both default to off, so that ``elbo`` is a plain likelihood estimate whose ratio is exactly 1
    before the first update, like every other objective of the project (docs/methods.md):

    Args:
        cfg_division: divide every log-likelihood (the policy's, the old policy's and the
            reference's) by the training guidance ``G`` with ``adaptive`` weighting and by
            ``G^2`` with ``uniform``, as ``compute_elbo`` (``src/utils/__init__.py``) does, so
            its magnitude does not grow with the CFG scale (the error of a guided velocity grows
            like ``G``). A no-op at ``G = 1``; only these two weightings have it.
        old_policy: ``current`` (the old log-likelihoods are the weights' own before the first
            update: ratio 1 there) or ``ema``: the authors' old policy, an EMA copy of the
            weights (:class:`LaggedCopy`, ``decay_rate``, ``decay_max``, ``decay_delay``; their
            ``DECAY_TYPE=1`` is ``min(0.001 n, 0.5)``, the defaults) that generates the
            rollouts and gives the old log-likelihoods (``src/train.py``, the ``old`` adapter):
            the ratio at an epoch's first update is ``exp(lp_theta - lp_ema)``, 1 only at the
            first iteration. The copy is checkpointed.
        adv_scale: a factor of the advantages: their ``ADV=exact`` advantage is
            ``BETA (R - mean) / ALPHA = 0.1 (R - mean)`` (``src/utils/__init__.py``
            ``PerPromptStatTracker``; scripts ``BETA=1e-4``, ``ALPHA=1e-3``), i.e.
            ``train.advantage: none``, ``train.adv_clip: 0`` and ``adv_scale: 0.1``.
    """

    def __init__(self, policy: Policy, draws: int = 4, timesteps: str = "uniform",
                 weighting: str = "adaptive", power: float = 0.25,
                 guidance: float | None = None, cfg_division: bool = False,
                 old_policy: str = "current", decay_rate: float = 0.001,
                 decay_max: float = 0.5, decay_delay: int = 0, adv_scale: float = 1.0,
                 old_log_probs: str = "recompute") -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        one_of("old_policy", old_policy, ("current", "ema"))
        self.recompute = _old_log_probs(old_log_probs)
        if not self.recompute and old_policy == "ema":
            raise ValueError("old_log_probs: on_policy takes the old log-likelihoods from the "
                             "trained weights; old_policy: ema needs them recomputed under the "
                             "EMA copy (use old_log_probs: recompute)")
        if not (math.isfinite(adv_scale) and adv_scale > 0):
            raise ValueError(f"adv_scale must be > 0 (the authors': 0.1), got {adv_scale}")
        self.adv_scale = float(adv_scale)
        if not isinstance(cfg_division, bool):
            raise ValueError(f"cfg_division must be true or false, got {cfg_division!r}")
        if cfg_division:
            powers = {"adaptive": 1, "uniform": 2}
            if weighting not in powers:
                raise ValueError(f"cfg_division divides the adaptive (by G) or uniform (by G^2) "
                                 f"ELBO only; got weighting {weighting!r}")
            self.lp_scale = 1.0 / self.guidance ** powers[weighting]
        self.old = (LaggedCopy(policy.params, decay_rate, decay_max, decay_delay, "elbo")
                    if old_policy == "ema" else None)

    def sampling(self):
        return super().sampling() if self.old is None else self.old.applied()

    def after_update(self) -> None:
        if self.old is not None:
            self.old.step()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.old is None else self.old.state_dict("old")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.old is not None:
            self.old.load_state_dict(state, "old")

    def prepare(self, batch, rows=None):
        draws = self.draws(batch)
        if not self.recompute:
            return draws, None
        if self.old is None:
            return draws, self.old_log_likelihoods(batch, draws, rows).mean(1)
        with self.old.applied():
            return draws, self.old_log_likelihoods(batch, draws, rows).mean(1)

    def units(self, batch):
        return [None]

    def loss(self, batch, state, idx, unit):
        draws, old = state
        return self.ratio_loss(batch, draws, None if old is None else old[idx], idx)


@OBJECTIVES.register("awm")
class AwmObjective(ForwardObjective):
    """Advantage Weighted Matching (Xue et al. 2025; code scxue/advantage_weighted_matching
    ``scripts/train_sd3_awm.py`` ``compute_log_prob_awm``; Flow-Factory ``trainers/rl/awm.py``).

    The pretraining flow-matching loss on the generated samples, weighted by advantage: every
    draw is its own training unit with log-likelihood proxy ``lp_k`` (default weighting
    ``ghuber``, ``p = 0.25``, the authors' default), its own ratio ``exp(lp_k - lp_k_old)``
    (``lp_old`` on the same draw before the first update) and the run's policy loss; the
    stabilisers are the ratio's trust region (``train.loss_params``) and a velocity-MSE KL to the
    reference (``train.beta``). At ratio 1 with ``uniform`` weighting the gradient is
    ``mean_i A_i grad ||v - u||^2 / B``: with every advantage 1 the flow-matching gradient, with
    every advantage 0 none.

    Two options reproduce the authors' configs (``config/dgx_awm.py``, commit be51372); both
    default to off (the plain advantage-weighted loss above):

    Args:
        adv_scale: a factor of the (clipped) advantages. The authors' configs set
            ``advantage_max: 1`` with ``adv_clip_max: 5``, i.e. ``A / 5``: ``adv_scale: 0.2``.
        ema_beta: the weight of the pull toward an EMA of the weights,
            ``ema_beta * mean ||v_theta - v_ema||^2`` on each unit's draw (their ``ema_beta: 1``
            with ``kl_ema_weight: Uniform``: a velocity MSE to the EMA model, not a parameter
            pull). The EMA copy (:class:`LaggedCopy`) starts equal to the weights and moves
            after each iteration with ``eta = min(ema_decay_rate * n, ema_decay_max)`` (their
            ``kl_ema_decay_type: linear``: ``min(0.001 n, 0.3)``, the defaults; ``constant`` is
            ``ema_decay_rate >= ema_decay_max``). Rollouts use the weights (their
            ``off_policy: False``). The copy is checkpointed. 0: no copy is kept.
    """

    def __init__(self, policy: Policy, draws: int = 4, timesteps: str = "uniform",
                 weighting: str = "ghuber", power: float = 0.25,
                 guidance: float | None = None, adv_scale: float = 1.0,
                 ema_beta: float = 0.0, ema_decay_rate: float = 0.001,
                 ema_decay_max: float = 0.3, old_log_probs: str = "recompute") -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        self.recompute = _old_log_probs(old_log_probs)
        if not (math.isfinite(adv_scale) and adv_scale > 0):
            raise ValueError(f"adv_scale must be > 0 (the authors': 0.2), got {adv_scale}")
        if not (math.isfinite(ema_beta) and ema_beta >= 0):
            raise ValueError(f"ema_beta must be >= 0 (0: no EMA pull), got {ema_beta}")
        self.adv_scale, self.ema_beta = float(adv_scale), float(ema_beta)
        self.ema = (LaggedCopy(policy.params, ema_decay_rate, ema_decay_max, 0, "awm")
                    if ema_beta > 0 else None)

    def after_update(self) -> None:
        if self.ema is not None:
            self.ema.step()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.ema is None else self.ema.state_dict("ema")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.ema is not None:
            self.ema.load_state_dict(state, "ema")

    def prepare(self, batch, rows=None):
        draws = self.draws(batch)
        old = self.old_log_likelihoods(batch, draws, rows) if self.recompute else None
        if self.ema is None:
            return draws, old, None
        final = batch.traj.final
        anchor = torch.zeros(len(final), self.k, *final.shape[1:], device=final.device)
        with self.ema.applied():
            fill(anchor, batch, rows, self.policy.batch_size,
                 lambda idx: self.velocities(batch, draws, idx)[0])
        return draws, old, anchor

    def units(self, batch):
        return list(range(self.k))

    def loss(self, batch, state, idx, unit):
        draws, old, anchor = state
        a = None if anchor is None else anchor[idx.to(anchor.device), unit]
        return self.ratio_loss(batch, draws, None if old is None else old[idx, unit], idx,
                               torch.tensor([unit]),
                               anchor=a, anchor_beta=self.ema_beta)


@OBJECTIVES.register("nft")
class NftObjective(ForwardObjective):
    """DiffusionNFT (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward
    Process"; code NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py``; Flow-Factory
    ``trainers/rl/nft.py``).

    The rewards become an optimality weight ``r = clamp(A / (2 adv_max) + 1/2, 0, 1)`` from the
    group-normalised (and clipped) advantage ``A``. With the old (sampling) policy's velocity
    ``v_old`` on the same draw, the implicit positive and negative policies are
    ``v+ = (1 - b) v_old + b v_theta`` and ``v- = (1 + b) v_old - b v_theta``, and

        loss = mean_i [ r_i L(v+_i) + (1 - r_i) L(v-_i) ],  L(v) = -lp(v - u, t)

    with the module's weightings (``adaptive``, the authors' adaptive loss weighting, by default:
    ``L = mean((x0_hat - x0)^2) / sg(mean|x0_hat - x0|)``). Every draw is a training unit. With
    ``r = 1/2`` and ``theta = old`` the gradient is 0; with ``r = 1`` it is ``b`` times the
    flow-matching gradient (both tested).

    The old policy is a snapshot of the trainable weights that generates the rollouts and gives
    ``v_old``; after each iteration ``old <- eta old + (1 - eta) theta`` with
    ``eta = min(decay_rate * n, decay_max)``, ``n`` the iterations done (the authors' default
    schedule, ``min(0.001 n, 0.5)``; ``decay_delay`` keeps ``eta = 0`` for the first iterations,
    their OCR schedule). The snapshot is checkpointed. DiffusionNFT trains and samples without
    CFG: set ``model.guidance: 1``, or keep CFG for rollouts and train CFG-free with
    ``guidance: 1`` here. The loss takes no ratio, so ``train.loss`` is not used; its analogue of
    "ratio 1 before the first update" is ``v_theta = v_old`` (``train/old_gap``, 0 at the first
    iteration).

    Args:
        strength: ``b``, how far the implicit policies sit from the old one (authors: 1.0; 0.1
            for OCR).
        adv_max: the advantage that maps to ``r = 1`` (authors: 5, their advantage clip).
        decay_rate, decay_max, decay_delay: the old policy's EMA schedule.
        scale_by_adv_max: multiply the loss by ``adv_max / b``, as the authors' code does
            (``scripts/train_nft_sd3.py``, commit 24af555: ``(r L+ + (1 - r) L-) / beta *
            adv_clip_max``; 5 by default, 50 for their OCR ``b = 0.1``); the KL term is not
            scaled. Off by default: ours then is the loss of the paper's equation, whose
            gradient at ``r = 1`` is ``b`` times the flow-matching one; a learning rate, gradient
            clip or ``beta`` copied from their configs needs it on (the ``paper:nft`` preset).
    """

    kl_estimators = ("velocity_mse",)

    def __init__(self, policy: Policy, draws: int = 4, timesteps: str = "uniform",
                 weighting: str = "adaptive", power: float = 0.25,
                 guidance: float | None = None, strength: float = 1.0, adv_max: float = 5.0,
                 decay_rate: float = 0.001, decay_max: float = 0.5,
                 decay_delay: int = 0, scale_by_adv_max: bool = False) -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        for key, value in (("strength", strength), ("adv_max", adv_max)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be > 0, got {value}")
        if not isinstance(scale_by_adv_max, bool):
            raise ValueError(f"scale_by_adv_max must be true or false, got {scale_by_adv_max!r}")
        self.b, self.adv_max = float(strength), float(adv_max)
        self.loss_scale = self.adv_max / self.b if scale_by_adv_max else 1.0
        self.old = LaggedCopy(policy.params, decay_rate, decay_max, decay_delay, "nft")

    @property
    def iterations(self) -> int:
        return self.old.iterations

    def sampling(self):
        return self.old.applied()

    def after_update(self) -> None:
        self.old.step()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.old.state_dict("old")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.old.load_state_dict(state, "old")

    def prepare(self, batch, rows=None):
        draws = self.draws(batch)
        final = batch.traj.final
        out = torch.zeros(len(final), self.k, *final.shape[1:], device=final.device)
        with self.old.applied():
            fill(out, batch, rows, self.policy.batch_size,
                 lambda idx: self.velocities(batch, draws, idx)[0])
        return draws, out

    def units(self, batch):
        return list(range(self.k))

    def optimality(self, adv: torch.Tensor) -> torch.Tensor:
        """``r = clamp(A / (2 adv_max) + 1/2, 0, 1)``."""
        return (adv / (2 * self.adv_max) + 0.5).clamp(0.0, 1.0)

    def loss(self, batch, state, idx, unit):
        draws, v_old_all = state
        p = self.policy
        k = torch.tensor([unit])
        v, u, t = self.velocities(batch, draws, idx, k)
        v_old = v_old_all[idx.to(v_old_all.device), unit].to(v.device)
        pos = (1 - self.b) * v_old + self.b * v
        neg = (1 + self.b) * v_old - self.b * v
        r = self.optimality(_advantage(batch, idx).to(v.device))
        weight = batch.sample_weights[idx].to(v.device)
        at = self.position_weight(batch, idx, k)
        per_sample = -(r * weighted_lp(pos - u, t, self.weighting, self.power, at)
                       + (1 - r) * weighted_lp(neg - u, t, self.weighting, self.power, at))
        loss = (per_sample * weight).mean() * self.loss_scale
        gap = (v.detach() - v_old).abs().flatten(1).amax(1)
        metrics: dict[str, Any] = {"train/old_gap": gap.max(), "train/optimality": r.mean()}
        kl = self.kl_term(batch, draws, idx, k, v, None)
        return add_kl(loss, metrics, kl, weight, p.beta)
