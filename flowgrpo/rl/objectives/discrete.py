"""dFlowGRPO: the per-step ratio objective of a discrete flow (docs/design.md, "State spaces").

A token model's denoising is a Markov decision process over a continuous-time Markov chain; each
trained step's probability is the path's step under the model's posterior
(:mod:`samplers.discrete`). Read from the authors' code (WanZhengyan/dFlowGRPO,
``discrete_flow_grpo/training_grpo.py`` and ``train_args.py`` at commit 6a7d207):

- the per-sample ratio of a step is the geometric mean over tokens of the per-token ratios
  (``log r = mean_d log r_d``), or over the tokens that changed at that step only
  (``--changed_only``);
- for the metric-induced path the step probability is estimated from ``n_mc`` posterior draws of
  the old policy, ``(1/n) sum_j p_theta(X1_j) K_j(x_next) / p_old(X1_j)`` (``n_mc`` 24);
- the last step is excluded by default (``--include_last_step``): here the ``ctmc`` sampler marks
  the step into ``sigma' = 0`` untrainable;
- the KL is ``(r - 1) - log r`` with ``r = p_theta / p_ref`` per sample (the ``ratio_k3``
  estimator), clip range ``1e-3`` / ``1.5e-3`` (``loss_params``), 8 steps, groups of 24, no CFG.

Where ours differs: the posterior draws are made from per-sample streams before the first update
(``posterior_draws``), not during the rollout, so any number of processes draws the same; the
rollout itself samples the exact step (``ctmc`` sums the metric kernel over the vocabulary) and
the estimator only replaces its log-probability, as theirs does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import samplers
from flowgrpo import seeding
from flowgrpo.rl.batch import RolloutBatch
from flowgrpo.rl.kl import KLInputs
from flowgrpo.rl.objectives.base import OBJECTIVES, Policy, RatioObjective, fill
from flowgrpo.rl.reference import reference
from flowgrpo.rl.replay import StepResult, step_sigmas
from flowgrpo.rl.rollout import model_velocity
from flowgrpo.validation import integer, one_of
from pipelines.base import LOGPROB_WEIGHT
from samplers.discrete import metric_mc_draws, metric_mc_log_prob

TOKENS_CHOICES = ("all", "changed")
ESTIMATORS = ("exact", "mc")


@dataclass
class DFlowState:
    """Per-batch state: old log-probs ``[B, V, J, P]`` and, for the Monte-Carlo estimator, the
    posterior draws and factors ``[B, V, J, L, n]`` of every trained step."""

    old: torch.Tensor
    draws: torch.Tensor | None = None
    factors: torch.Tensor | None = None


@OBJECTIVES.register("dflow_grpo")
class DFlowGRPO(RatioObjective):
    """dFlowGRPO's per-step ratio with a registered policy loss (``train.loss``).

    Units are ``(view, trained step)`` as in ``ratio``; each step's log-prob is the mean over
    the chosen tokens of the per-token log-probability of the stored next tokens.

    Args:
        tokens: ``all`` (the geometric mean over every token) or ``changed`` (over the tokens
            that changed at the step; a step where none changed has log-prob 0).
        estimator: ``exact`` (the sampler's step probability) or ``mc`` (dFlowGRPO's estimate
            from ``n_mc`` old-posterior draws; metric-induced paths only, where the exact sum
            costs ``O(V^2)`` per token).
        n_mc: posterior draws per token and step for ``mc``.
        guidance: CFG scale of the replayed steps (None: the rollout's).
    """

    kl_estimators = ("ratio_k3", "log_ratio", "exact")
    state_space = samplers.TOKENS

    def __init__(self, policy: Policy, tokens: str = "all", estimator: str = "exact",
                 n_mc: int = 24, guidance: float | None = None) -> None:
        super().__init__(policy, guidance=guidance)
        one_of("tokens", tokens, TOKENS_CHOICES)
        one_of("estimator", estimator, ESTIMATORS)
        integer("n_mc", n_mc, 1)
        if policy.sampler.state_space is not samplers.TOKENS:
            raise ValueError(f"dflow_grpo trains a discrete model: sampler "
                             f"{policy.sampler.name!r} steps in continuous states (use ctmc)")
        path = getattr(policy.adapter, "path", None)
        if estimator == "mc" and getattr(path, "kind", None) != "metric":
            raise ValueError("estimator 'mc' estimates a metric-induced path's step; this model's "
                             "path is exact already (use estimator: exact)")
        if policy.kl == "exact" and (tokens != "all" or estimator != "exact"):
            raise ValueError("the exact KL is over every token of the exact step: use "
                             "train.kl: ratio_k3 with tokens 'changed' or estimator 'mc'")
        self.tokens, self.estimator, self.n_mc = tokens, estimator, n_mc

    # --- state before the first update --------------------------------------------------------

    def prepare(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> DFlowState:
        traj = batch.traj
        if (self.tokens == "all" and self.estimator == "exact" and len(batch.views) == 1
                and batch.regions is None and self.guidance == self.policy.guidance):
            return DFlowState(traj.log_probs[:, None, :, None])
        state = DFlowState(torch.zeros(batch.advantages.shape, device=traj.log_probs.device))
        if self.estimator == "mc":
            shape = (*batch.advantages.shape[:3], traj.latents.shape[-1], self.n_mc)
            state.draws = torch.zeros(shape, dtype=torch.long, device=traj.latents.device)
            state.factors = torch.zeros(shape, device=traj.latents.device)
            uniforms = self._uniforms(batch, shape)
            for v in range(len(batch.views)):
                for j in range(traj.num_trained):
                    self._draw(batch, state, rows, uniforms, v, j)
        for v in range(len(batch.views)):
            for j in range(traj.num_trained):
                fill(state.old[:, v, j], batch, rows, self.policy.batch_size,
                     lambda idx, v=v, j=j: self.replay(batch, idx, v, j, None,
                                                       state).log_prob)
        return state

    def _uniforms(self, batch: RolloutBatch, shape: tuple[int, ...]) -> torch.Tensor:
        """``[B, V, J, L, n]`` uniforms, each sample's from its own stream (global index)."""
        gens = [seeding.generator("posterior_draws", self.policy.seed, batch.iteration, i)
                for i in batch.index.tolist()]
        return torch.stack([torch.rand(shape[1:], generator=g) for g in gens])

    @torch.no_grad()
    def _draw(self, batch, state, rows, uniforms, v, j) -> None:
        """The draws and factors of trained step ``j`` under view ``v`` (old policy)."""
        rows = torch.arange(len(batch.groups)) if rows is None else rows.cpu()
        for start in range(0, len(rows), self.policy.batch_size):
            idx = rows[start:start + self.policy.batch_size]
            x, x_next, s, s_next, logits = self._logits(batch, idx, v, j)
            path = self.policy.adapter.path
            draws, factors = [], []
            for i in range(len(idx)):  # one sample at a time: its own step
                si = float(s if not isinstance(s, torch.Tensor) else s[i])
                ni = float(s_next if not isinstance(s_next, torch.Tensor) else s_next[i])
                t = min(max(1.0 - si, path.t_min), 1.0 - 1e-6)
                d, f = metric_mc_draws(logits[i:i + 1], x[i:i + 1], x_next[i:i + 1],
                                       path.distance.to(x.device), t, si - ni,
                                       uniforms[idx[i], v, j][None].to(x.device),
                                       path.c, path.a)
                draws.append(d)
                factors.append(f)
            state.draws[idx, v, j] = torch.cat(draws)
            state.factors[idx, v, j] = torch.cat(factors)

    # --- the replayed step --------------------------------------------------------------------

    def _logits(self, batch: RolloutBatch, idx: torch.Tensor, v: int, j: int):
        traj, p = batch.traj, self.policy
        rows = idx.to(traj.latents.device)
        k = traj.trained[idx, j].to(traj.latents.device)
        x, x_next = traj.latents[rows, k].long(), traj.latents[rows, k + 1].long()
        s, s_next = step_sigmas(traj, k)
        cond = batch.views[v].index(idx)
        velocity = model_velocity(p.adapter, cond, self.guidance, p.autocast)
        return x, x_next, s, s_next, velocity(x, traj.sigmas.to(x.device)[k])

    def _token_log_probs(self, logits, x, x_next, s, s_next, state, idx, v, j):
        if self.estimator == "mc":
            return metric_mc_log_prob(logits, x, state.draws[idx, v, j], state.factors[idx, v, j])
        return self.policy.sampler.transition(logits, x, s, s_next).token_log_probs(x_next)

    def _reduce(self, tok: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor,
                weight: torch.Tensor | None, regions: torch.Tensor | None) -> torch.Tensor:
        """``[b]`` (``[b, P]`` with regions): the mean of ``tok [b, L]`` over the chosen tokens
        (``all`` keeps the Gaussian's reduction: ``mean(weight * lp)``)."""
        w = torch.ones_like(tok) if weight is None else weight.to(tok).expand_as(tok)
        maps = [None] if regions is None else list(regions)
        out = []
        for m in maps:
            wm = w if m is None else w * (m / m.float().mean().clamp_min(1e-12)).to(tok)
            if self.tokens == "all":
                out.append((wm * tok).mean(1))
            else:
                changed = (x_next != x).to(tok)
                out.append((wm * changed * tok).sum(1) / changed.sum(1).clamp_min(1.0))
        return out[0] if regions is None else torch.stack(out, 1)

    def replay(self, batch: RolloutBatch, idx: torch.Tensor, v: int, j: int, kl,
               state: DFlowState | None = None) -> StepResult:
        p = self.policy
        x, x_next, s, s_next, logits = self._logits(batch, idx, v, j)
        weight = batch.views[v].index(idx).tensors.get(LOGPROB_WEIGHT)
        tok = self._token_log_probs(logits, x, x_next, s, s_next, state, idx, v, j)
        log_prob = self._reduce(tok, x, x_next, weight, batch.regions)
        if kl is None:
            return StepResult(log_prob, None)
        with torch.no_grad(), reference(p.adapter):
            ref_logits = self._logits(batch, idx, v, j)[-1]
        ref_tok = self._token_log_probs(ref_logits, x, x_next, s, s_next, state, idx, v, j)
        logp = self._reduce(tok, x, x_next, weight, None)
        ref_logp = self._reduce(ref_tok, x, x_next, weight, None)
        inputs = KLInputs(logp=logp, ref_logp=ref_logp, weight=weight)
        if self.estimator == "exact":
            inputs.transition = p.sampler.transition(logits, x, s, s_next)
            inputs.ref_transition = p.sampler.transition(ref_logits, x, s, s_next)
        return StepResult(log_prob, kl(inputs))

    def loss(self, batch, state, idx, unit):
        v, j = unit
        result = self.replay(batch, idx, v, j, kl=self.kl, state=state)
        return self.step_loss(batch, state.old, idx, v, j, result.log_prob, result.kl)
