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
from flowgrpo.rl import losses
from flowgrpo.rl.batch import RolloutBatch
from flowgrpo.rl.kl import KLInputs
from flowgrpo.rl.objectives.base import (
    OBJECTIVES,
    Objective,
    Policy,
    RatioObjective,
    add_kl,
    fill,
)
from flowgrpo.rl.reference import reference
from flowgrpo.rl.replay import StepResult, step_sigmas
from flowgrpo.rl.rollout import model_velocity
from flowgrpo.validation import integer, one_of
from pipelines.base import LOGPROB_WEIGHT
from samplers.discrete import distinct_steps, metric_mc_draws, metric_mc_log_prob

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
        """The draws and factors of trained step ``j`` under view ``v`` (old policy), one
        batched call per distinct step ``(s, s')`` among the samples."""
        rows = torch.arange(len(batch.groups)) if rows is None else rows.cpu()
        path = self.policy.adapter.path
        for start in range(0, len(rows), self.policy.batch_size):
            idx = rows[start:start + self.policy.batch_size]
            x, x_next, s, s_next, logits = self._logits(batch, idx, v, j)
            for si, ni, part in distinct_steps(s, s_next, len(idx)):
                t = min(max(1.0 - si, path.t_min), 1.0 - 1e-6)
                part_dev = part.to(x.device)
                d, f = metric_mc_draws(logits[part_dev], x[part_dev], x_next[part_dev],
                                       path.distance.to(x.device), t, si - ni,
                                       uniforms[idx[part], v, j].to(x.device), path.c, path.a)
                state.draws[idx[part], v, j] = d.to(state.draws.device)
                state.factors[idx[part], v, j] = f.to(state.factors.device)

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


# --------------------------------------------------------------------------- likelihood-free

STATES = ("forward", "remask", "one_shot")
DEFAULT_NUM_STATES = {"forward": 3, "remask": 4, "one_shot": 1}


@dataclass
class UdmState:
    """Per-batch state: the rebuilt states ``[B, K, L]`` and their noise levels ``[B, K]``, the
    tokens each scores ``[B, K, L]`` and the old log-probs ``[B, K]``."""

    states: torch.Tensor
    sigmas: torch.Tensor
    scored: torch.Tensor
    old: torch.Tensor


@OBJECTIVES.register("udm_grpo")
class UdmGRPO(Objective):
    """The likelihood-free objective of a discrete flow: the final sample is the action, and
    the states the loss sees are rebuilt from it, never the rollout's own (docs/design.md,
    "State spaces").

    For each sample ``x1`` and each of ``K`` states ``x~_k`` (drawn once per sample and iteration
    from its ``forward_states`` stream, so the old and the new policy see the same states), the
    log-probability is the mean over the scored tokens of ``log p_theta(x1 | x~_k)``; the run's
    policy loss (``train.loss``) takes ``ratio = exp(logp - logp_old)`` per state, each state a
    training unit, with ``logp_old`` computed on the same states before the first update (the
    ratio is exactly 1 there), plus ``beta`` times the KL (``log_ratio``, the k3 estimator
    ``exp(ref - logp) - (ref - logp) - 1``, by default). With a masked path the mask never is a
    clean token (its column is dropped) and only masked tokens are scored: an unmasked token is
    its own posterior. How the states are built (``states``):

    - ``forward`` (UDM-GRPO; Yovecent/UDM-GRPO ``diffnext/pipelines/ursa/pipeline_grpo.py``
      ``process_latents``, ``postprocess``): ``x~_k = corrupt(x1, sigma_{s+k})`` by the model's
      own forward process at ``K`` consecutive noise levels of the rollout's grid from a random
      start ``s`` in ``[start[0], start[1])`` (authors: ``K = 3``, start in ``[0, 3)`` of 10
      steps), which keeps the states on the path the model was pretrained on;
    - ``remask`` (MaskGRPO; martian422/MaskGRPO ``grpo/mask_grpo_trainer.py`` ``remask_t2i``):
      each token of ``x1`` is masked with probability ``r_k = min(m + (1 - m)(k + 1) / K,
      0.999)`` (``m = mask_ratio``, 0.6), masked tokens scored; masked paths only;
    - ``one_shot`` (diffu-GRPO; dllm-reasoning/d1): every token masked at once, one state;
      masked paths only.

    Reduced-Step rollouts are ``sampler.num_steps`` below ``sampler.eval_num_steps`` (authors: 10
    against 25); CFG-free training is ``guidance: 1`` (authors: guidance 1 in both). Their
    other settings: clip range 1e-4, advantages clipped at 5, beta 0.05.

    Where ours differs, on purpose: UDM-GRPO takes one gradient step per rollout with the
    ratio's value fixed at 1 (its old log-probs are never set), and draws the start once per
    batch; here the old log-probs are those of the same rebuilt states, so several updates per
    batch keep a true ratio, and each sample draws its own start (any number of processes draws
    the same). MaskGRPO remasks at ratio ``r_k`` in inner iteration ``k``; here the ``K`` ratios
    are the ``K`` units of every update pass. diffu-GRPO also masks the prompt's tokens
    (``p_mask_prompt``) with a fresh seed per inner iteration; a condition here is an encoding,
    not tokens, so its one-shot state is deterministic. MaskGRPO and diffu-GRPO clip per-token
    ratios; here, as in UDM-GRPO, the ratio is of the mean token log-probability per sample.

    Args:
        states: ``forward``, ``remask`` or ``one_shot``.
        num_states: ``K`` (None: 3 for ``forward``, 4 for ``remask``, 1 for ``one_shot``).
        start: ``[lo, hi)`` of the first forward state's index on the rollout grid.
        mask_ratio: ``m``, the remask schedule's floor.
        guidance: CFG scale of the training forwards (None: the run's ``model.guidance``).
    """

    needs_transitions = False
    state_space = samplers.TOKENS
    kl_estimators = ("log_ratio", "ratio_k3")

    def __init__(self, policy: Policy, states: str = "forward", num_states: int | None = None,
                 start: tuple[int, int] | list[int] = (0, 3), mask_ratio: float = 0.6,
                 guidance: float | None = None) -> None:
        super().__init__(policy)
        one_of("states", states, STATES)
        k = DEFAULT_NUM_STATES[states] if num_states is None else num_states
        integer("num_states", k, 1)
        if states == "one_shot" and k != 1:
            raise ValueError(f"states 'one_shot' has one state (every token masked), got "
                             f"num_states {k}")
        lo, hi = _pair("start", start)
        if not 0 <= lo < hi:
            raise ValueError(f"start must be [lo, hi) with 0 <= lo < hi, got {list(start)}")
        if not 0.0 <= float(mask_ratio) < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio!r}")
        if guidance is not None and not float(guidance) >= 0:
            raise ValueError(f"guidance must be >= 0, got {guidance!r}")
        path = getattr(policy.adapter, "path", None)
        if states != "forward" and getattr(path, "kind", None) != "masked":
            raise ValueError(f"states {states!r} masks tokens: it needs a masked path (this "
                             f"model's is {getattr(path, 'kind', None)!r}; use states: forward)")
        self.states, self.k, self.start, self.mask_ratio = states, k, (lo, hi), float(mask_ratio)
        self.guidance = policy.guidance if guidance is None else float(guidance)

    def remask_ratios(self) -> list[float]:
        """MaskGRPO's ``r_k = min(m + (1 - m)(k + 1) / K, 0.999)``, ``k = 0..K-1``."""
        m = self.mask_ratio
        return [min(m + (1 - m) * (k + 1) / self.k, 0.999) for k in range(self.k)]

    def build_states(self, batch: RolloutBatch) -> UdmState:
        """The ``K`` states of every sample, each from its own stream (global index)."""
        x1 = batch.traj.final.long().cpu()
        b, length = x1.shape
        path = self.policy.adapter.path
        states = torch.empty(b, self.k, length, dtype=torch.long)
        sigmas = torch.empty(b, self.k)
        scored = torch.ones(b, self.k, length, dtype=torch.bool)
        grid = batch.traj.sigmas.float().cpu().reshape(-1)
        if self.states == "forward" and self.start[1] - 1 + self.k > len(grid) - 1:
            raise ValueError(f"start {list(self.start)} with num_states {self.k} runs past the "
                             f"rollout's {len(grid) - 1} steps")
        for row, i in enumerate(batch.index.tolist()):
            gen = seeding.generator("forward_states", self.policy.seed, batch.iteration, i)
            if self.states == "forward":
                s = int(torch.randint(self.start[0], self.start[1], (1,), generator=gen))
                sigmas[row] = grid[s:s + self.k]
                for k in range(self.k):
                    states[row, k] = self.policy.adapter.corrupt(
                        x1[row:row + 1], float(sigmas[row, k]), gen)[0]
            elif self.states == "remask":
                for k, r in enumerate(self.remask_ratios()):
                    masked = torch.rand(length, generator=gen) < r
                    states[row, k] = torch.where(masked, path.mask_id, x1[row])
                    sigmas[row, k] = r
            else:
                states[row] = path.mask_id
                sigmas[row] = 1.0
        if path.kind == "masked":
            scored = states == path.mask_id
        device = batch.traj.latents.device
        return UdmState(states.to(device), sigmas.to(device), scored.to(device),
                        torch.zeros(b, self.k, device=device))

    def log_probs(self, batch: RolloutBatch, state: UdmState, idx: torch.Tensor,
                  k: int | None = None) -> torch.Tensor:
        """``[b, K']`` mean log-probability of ``x1`` over the scored tokens of states ``k`` (all
        ``K`` when None), in one model call (grad when enabled)."""
        p, traj = self.policy, batch.traj
        rows = idx.to(traj.latents.device)
        ks = torch.arange(self.k) if k is None else torch.tensor([k])
        ks = ks.to(rows.device)
        x = state.states[rows][:, ks].flatten(0, 1)
        x1 = traj.final[rows].long().repeat_interleave(len(ks), 0)
        cond = traj.cond.index(idx.repeat_interleave(len(ks)))
        logits = model_velocity(p.adapter, cond, self.guidance, p.autocast)(
            x, state.sigmas[rows][:, ks].reshape(-1)).float()
        mask_id = p.adapter.path.mask_id
        if mask_id is not None:  # the mask is never a clean token
            logits = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device),
                                       float("-inf"))
        tok = logits.log_softmax(-1).gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        w = state.scored[rows][:, ks].flatten(0, 1).to(tok)
        weight = cond.tensors.get(LOGPROB_WEIGHT)
        if weight is not None:  # positions the model does not generate are not scored
            w = w * weight.to(tok).reshape(len(x), -1)
        lp = (w * tok).sum(1) / w.sum(1).clamp_min(1.0)
        return lp.reshape(len(idx), len(ks))

    def prepare(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> UdmState:
        state = self.build_states(batch)
        fill(state.old, batch, rows, self.policy.batch_size,
             lambda idx: self.log_probs(batch, state, idx))
        return state

    def units(self, batch: RolloutBatch) -> list[int]:
        return list(range(self.k))

    def loss(self, batch, state, idx, unit):
        p = self.policy
        logp = self.log_probs(batch, state, idx, unit)[:, 0]
        weight = batch.sample_weights[idx].to(logp.device)
        adv = batch.advantages[idx].reshape(len(idx), -1)[:, 0].to(logp.device)
        old = state.old[idx.to(state.old.device), unit].to(logp.device)
        loss, metrics = losses.get(p.loss)(logp, old, adv * weight, **p.loss_params)
        kl = None
        if self.kl is not None:
            with torch.no_grad(), reference(p.adapter):
                ref = self.log_probs(batch, state, idx, unit)[:, 0]
            kl = self.kl(KLInputs(logp=logp, ref_logp=ref))
        return add_kl(loss, metrics, kl, weight, p.beta)


def _pair(name: str, value) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be two integers [lo, hi), got {value!r}") from None
    return lo, hi
