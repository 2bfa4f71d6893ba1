"""Preference objectives on final samples: DGPO, Diffusion-DPO (online and offline) and SFT.

Like the likelihood-free objectives (:mod:`flowgrpo.rl.objectives.likelihood_free`) they train on
the final samples ``x0`` through the forward process, on the stored draws ``(t_k, eps_k)``: the
flow-matching error of a sample on draw ``k`` is ``e = mean((v(x_t, t_k) - (eps_k - x0))^2)``
(``uniform`` weighting by default, the authors' plain MSE), so rollouts may use the
deterministic ODE. Every draw is a training unit.

* ``dgpo`` (Luo et al., ICLR 2026, "Reinforcing Diffusion Models by Direct Group Preference
  Optimization"; code Luo-Yihong/DGPO ``scripts/train_sd3_dgpo.py``
  ``compute_group_dgpo_loss_allreduce``, commit 4894284): a group-level Bradley-Terry preference
  between the positive and the negative part of each group, whose gradient is the
  advantage-weighted flow-matching gradient times one weight per group,
  ``w_g = sigmoid(beta_dpo * sum_{i in g} A_i (e_i - e_ref_i) / G)``.
* ``dpo`` (Wallace et al. 2024, "Diffusion Model Alignment Using Direct Preference
  Optimization", in its flow-matching form, as Flow-Factory's and flow_grpo's DPO baselines):
  ``-log sigmoid(-beta_dpo / 2 * ((e_w - e_l) - (e_ref_w - e_ref_l)))`` on pairs: online, the
  best and the worst sample of each group (by reward); offline, pairs of a preference file.
* ``sft``: the flow-matching loss on the ``top_k`` best samples of each group (flow_grpo ships it
  beside DPO as a baseline).

The ratio-1 contract's analogue: DGPO's and DPO's implicit reward margin
``e - e_ref`` (``train/margin``) is 0 while the policy is the reference, i.e. at the first update
of a run (the LoRA adapters start at 0); SFT has no reference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flowgrpo import seeding
from flowgrpo.rl.batch import RolloutBatch, chunks
from flowgrpo.rl.kl import KLInputs
from flowgrpo.rl.objectives.base import OBJECTIVES, Policy, add_kl, fill
from flowgrpo.rl.objectives.likelihood_free import Draws, ForwardObjective
from flowgrpo.rl.reference import reference
from flowgrpo.validation import integer, one_of


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def group_extremes(scores: torch.Tensor, groups: torch.Tensor,
                   valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(best, worst)`` sample indices of every group (of the valid samples) with at least two
    distinct scores; ties go to the lowest index."""
    best, worst = [], []
    for g in torch.unique(groups).tolist():
        rows = (groups == g).nonzero().flatten()
        if valid is not None:
            rows = rows[valid[rows].bool()]
        if len(rows) < 2:
            continue
        s = scores[rows].float()
        if bool(s.max() == s.min()):
            continue
        best.append(int(rows[int(torch.argmax(s))]))
        worst.append(int(rows[int(torch.argmin(s))]))
    return torch.tensor(best, dtype=torch.long), torch.tensor(worst, dtype=torch.long)


def dpo_loss(e_w: torch.Tensor, e_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean -log sigmoid(x), x)`` with ``x = -beta / 2 ((e_w - e_l) - (ref_w - ref_l))``:
    Diffusion-DPO on the flow-matching errors of winners and losers ``[n]``."""
    inside = -0.5 * beta * ((e_w - e_l) - (ref_w.detach() - ref_l.detach()))
    return -F.logsigmoid(inside).mean(), inside


class _PreferenceBase(ForwardObjective):
    """Per-draw flow-matching errors of the policy and the frozen reference."""

    kl_estimators = ("velocity_mse",)

    def __init__(self, policy: Policy, draws: int = 1, timesteps: str = "uniform",
                 weighting: str = "uniform", power: float = 0.25,
                 guidance: float | None = None) -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)

    def errors(self, batch: RolloutBatch, draws: Draws, idx: torch.Tensor,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(e [b], v)``: the error ``-lp`` of samples ``idx`` on draw ``k`` (grad when
        enabled) and the velocities."""
        ks = torch.tensor([k])
        v, u, t = self.velocities(batch, draws, idx, ks)
        return -self.lp(v - u, t, self.position_weight(batch, idx, ks)), v

    @torch.no_grad()
    def reference_errors(self, batch, draws, rows) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([B, K] errors, [B, K, ...] velocities or None without a KL term)`` of the
        reference for ``rows`` (None: all), one no-grad call per sample and draw."""
        final = batch.traj.final
        err = torch.zeros(len(final), self.k, device=final.device)
        vel = (torch.zeros(len(final), self.k, *final.shape[1:], device=final.device)
               if self.kl is not None else None)
        rows = torch.arange(len(final)) if rows is None else rows.cpu()
        with reference(self.policy.adapter):
            for k in range(self.k):
                for sl in chunks(len(rows), self.policy.batch_size):
                    idx = rows[sl]
                    e, v = self.errors(batch, draws, idx, k)
                    err[idx.to(err.device), k] = e.float()
                    if vel is not None:
                        vel[idx.to(vel.device), k] = v.reshape(len(idx), *final.shape[1:])
        return err, vel

    def kl_from(self, v, ref_v, n):
        if self.kl is None:
            return None
        return self.kl(KLInputs(v=v.reshape(n, -1), ref_v=ref_v.reshape(n, -1).to(v.device)))

    def units(self, batch):
        return list(range(self.k))


@OBJECTIVES.register("dgpo")
class DgpoObjective(_PreferenceBase):
    """Direct Group Preference Optimization (module docstring for the source).

    With ``e_i`` the policy's and ``e_ref_i`` the frozen reference's flow-matching errors on the
    same draw and ``A_i`` the group-normalised advantage,

        w_g  = sigmoid(beta_dpo * sum_{i in g} A_i sg(e_i - e_ref_i) / G)
        loss = mean_i sg(w_{g(i)}) A_i e_i

    which is the gradient of ``-log sigmoid(R(G+) - R(G-))`` with the group reward
    ``R = -beta_dpo / G * sum A_i (e_i - e_ref_i)`` up to the constant ``beta_dpo / G`` (the
    authors' code drops it too). While the policy is the reference every ``w_g`` is 1/2 and the
    loss is half the advantage-weighted flow-matching loss (tested).

    Where this differs from the authors' code, on purpose:

    * the group weights are computed before the first update of an iteration (on this process's
      samples; a process holds whole groups), not from the training forward of a minibatch that
      must hold whole groups: the same on the authors' one-step layout, and valid for any
      minibatch layout. It costs one no-grad call per sample and draw;
    * the timesteps and noises are per sample (the stored draws), theirs shared by the group;
    * their optional PPO-style clip and EMA reference are not offered.

    Args:
        beta_dpo: the preference temperature (authors: 100 with CFG-free training, 2000-5000
            with an EMA reference).
        draws, timesteps, weighting, power, guidance: as the likelihood-free objectives
            (defaults: one draw, uniform ``t``, the plain MSE).
    """

    def __init__(self, policy: Policy, beta_dpo: float = 100.0, draws: int = 1,
                 timesteps: str = "uniform", weighting: str = "uniform", power: float = 0.25,
                 guidance: float | None = None) -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        self.beta_dpo = _positive("beta_dpo", beta_dpo)

    def group_weights(self, adv: torch.Tensor, delta: torch.Tensor, groups: torch.Tensor,
                      size: int) -> torch.Tensor:
        """``[B]`` the weight ``w_g`` of each sample's group from ``A [B]`` and
        ``delta = e - e_ref [B]``."""
        ids, inverse = torch.unique(groups, return_inverse=True)
        sums = torch.zeros(len(ids), dtype=torch.float32, device=adv.device)
        sums.scatter_add_(0, inverse.to(adv.device), (adv * delta).float())
        return torch.sigmoid(self.beta_dpo * sums / size)[inverse.to(adv.device)]

    def prepare(self, batch, rows=None):
        draws = self.draws(batch)
        ref_err, ref_v = self.reference_errors(batch, draws, rows)
        final = batch.traj.final
        err = torch.zeros(len(final), self.k, device=final.device)
        for k in range(self.k):
            fill(err[:, k], batch, rows, self.policy.batch_size,
                 lambda idx, k=k: self.errors(batch, draws, idx, k)[0])
        adv = batch.advantages.reshape(len(final), -1)[:, 0].to(final.device)
        size = int(torch.bincount(torch.unique(batch.groups, return_inverse=True)[1]).max())
        delta = err - ref_err
        weights = torch.stack([self.group_weights(adv, delta[:, k], batch.groups.to(adv.device),
                                                  size) for k in range(self.k)], 1)
        return draws, ref_err, ref_v, weights, delta

    def loss(self, batch, state, idx, unit):
        draws, ref_err, ref_v, weights, delta = state
        e, v = self.errors(batch, draws, idx, unit)
        rows = idx.to(weights.device)
        adv = batch.advantages[idx].reshape(len(idx), -1)[:, 0].to(e.device)
        weight = batch.sample_weights[idx].to(e.device)
        w = weights[rows, unit].to(e.device)
        loss = (w.detach() * adv * e * weight).mean()
        metrics: dict[str, Any] = {"train/margin": delta[rows, unit].abs().mean(),
                                   "train/group_weight": w.mean()}
        kl = None if ref_v is None else self.kl_from(v, ref_v[rows, unit], len(idx))
        return add_kl(loss, metrics, kl, weight, self.policy.beta)


@OBJECTIVES.register("dpo")
class DpoObjective(_PreferenceBase):
    """Diffusion-DPO in its flow-matching form (module docstring for the sources).

    For a pair (winner ``w``, loser ``l``) on the same draw (the winner's ``t`` and noise for
    both, as Diffusion-DPO shares them within a pair),

        loss = -log sigmoid(-beta_dpo / 2 * ((e_w - e_l) - (e_ref_w - e_ref_l)))

    At the reference the loss is ``log 2`` and its gradient ``beta_dpo / 4 * grad(e_w - e_l)``
    (tested against autograd). The loss of a minibatch is the mean over its pairs (online: the
    pairs whose winner it holds).

    Args:
        pairs: ``online``: the best and the worst sample of each group of the rollout (groups
            whose rewards are all equal give no pair); ``file``: pairs of ``preference_file``.
        preference_file: a folder with ``pairs.safetensors`` (tensors ``chosen`` and
            ``rejected``, ``[N, ...]`` clean latents of the model's latent shape) and
            ``prompts.json`` (a list of ``N`` prompt strings); no pickle is read. Each
            iteration trains on ``pairs_per_iteration`` pairs drawn without replacement from
            the ``preference_pairs`` stream and trained with every minibatch (the rollout
            still runs: its rewards are logged, its samples are not trained).
        pairs_per_iteration: offline pairs per iteration (default 8).
        beta_dpo: the DPO temperature (Diffusion-DPO's 5000 on SD; Flow-Factory's default).
    """

    def __init__(self, policy: Policy, beta_dpo: float = 5000.0, pairs: str = "online",
                 preference_file: str = "", pairs_per_iteration: int = 8, draws: int = 1,
                 timesteps: str = "uniform", weighting: str = "uniform", power: float = 0.25,
                 guidance: float | None = None) -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        self.beta_dpo = _positive("beta_dpo", beta_dpo)
        self.pairs = one_of("pairs", pairs, ("online", "file"))
        integer("pairs_per_iteration", pairs_per_iteration, 1)
        self.per_iteration = pairs_per_iteration
        self.offline = load_preference_file(preference_file) if pairs == "file" else None
        if pairs == "online" and preference_file:
            raise ValueError("preference_file is read with pairs: file; with pairs: online the "
                             "pairs come from the rollout's groups")

    def prepare(self, batch, rows=None):
        if self.offline is not None:
            batch = self.offline_batch(batch)
        best, worst = group_extremes(batch.reward.scores, batch.groups.cpu(),
                                     None if batch.valid is None else batch.valid.cpu())
        draws = self.draws(batch)
        # the loser is evaluated on its winner's draw
        draws.t[worst] = draws.t[best]
        draws.noise[worst] = draws.noise[best]
        rows = torch.cat([best, worst]) if len(best) else None
        ref_err, ref_v = self.reference_errors(batch, draws, rows)
        return batch, draws, best, worst, ref_err, ref_v

    def offline_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """A batch of preference-file pairs: winner ``i`` and loser ``n + i`` form group ``i``,
        scored 1 and 0."""
        chosen, rejected, prompts = self.offline
        gen = seeding.generator("preference_pairs", self.policy.seed, batch.iteration)
        pick = torch.randperm(len(prompts), generator=gen)[:self.per_iteration]
        device = batch.traj.latents.device
        final = torch.cat([chosen[pick], rejected[pick]]).to(device).float()
        texts = [prompts[i] for i in pick.tolist()] * 2
        cond = self.policy.session.encode(texts, [{} for _ in texts])
        n = len(pick)
        from flowgrpo.rl.rollout import Trajectory
        from reward_models import RewardOutput

        traj = Trajectory(final[:, None], torch.zeros(1), torch.zeros(2 * n, 0, dtype=torch.long),
                          torch.zeros(2 * n, 0), cond)
        groups = torch.arange(n).repeat(2)
        scores = torch.cat([torch.ones(n), torch.zeros(n)])
        out = RolloutBatch(traj, texts, [{"group": int(g)} for g in groups.tolist()], groups,
                           RewardOutput(scores), torch.ones(2 * n, 0))
        out.iteration, out.index = batch.iteration, torch.arange(2 * n)
        out.sample_weights = torch.ones(2 * n)
        return out

    def loss(self, batch, state, idx, unit):
        data, draws, best, worst, ref_err, ref_v = state
        p = self.policy
        if self.offline is None:  # a pair is trained with the minibatch that holds its winner
            mine = torch.isin(best, idx.cpu())
            b, w = best[mine], worst[mine]
        else:  # the iteration's file pairs are trained with every minibatch
            b, w = best, worst
        if len(b) == 0:  # no pair here: a zero-weight pass keeps every process in step
            e, _ = self.errors(batch, draws, idx[:1], unit)
            return add_kl((e * 0).sum(), {}, None, torch.ones(1), 0.0)
        e, v = self.errors(data, draws, torch.cat([b, w]), unit)
        e_w, e_l = e[:len(b)], e[len(b):]
        dev = e.device
        r_w, r_l = ref_err[b, unit].to(dev), ref_err[w, unit].to(dev)
        loss, inside = dpo_loss(e_w, e_l, r_w, r_l, self.beta_dpo)
        metrics: dict[str, Any] = {
            "train/margin": ((e_w - r_w) - (e_l - r_l)).detach().abs().mean(),
            "train/pair_accuracy": (inside > 0).float().mean()}
        kl = (None if ref_v is None
              else self.kl_from(v, ref_v[torch.cat([b, w]), unit], 2 * len(b)))
        return add_kl(loss, metrics, kl, torch.ones(2 * len(b), device=dev), p.beta)


def load_preference_file(folder: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(chosen, rejected, prompts)`` of a preference folder (:class:`DpoObjective`)."""
    from safetensors.torch import load_file

    if not folder:
        raise ValueError("pairs: file needs preference_file, a folder with pairs.safetensors "
                         "and prompts.json")
    path = Path(folder)
    tensors, names = path / "pairs.safetensors", path / "prompts.json"
    if not (tensors.is_file() and names.is_file()):
        raise ValueError(f"preference_file {folder}: needs pairs.safetensors and prompts.json")
    data = load_file(str(tensors))
    prompts = json.loads(names.read_text(encoding="utf-8"))
    if set(data) != {"chosen", "rejected"}:
        raise ValueError(f"{tensors}: needs exactly the tensors chosen and rejected, got "
                         f"{sorted(data)}")
    chosen, rejected = data["chosen"], data["rejected"]
    if chosen.shape != rejected.shape or not isinstance(prompts, list) or not all(
            isinstance(p, str) for p in prompts) or len(prompts) != len(chosen):
        raise ValueError(f"preference_file {folder}: chosen and rejected must have one shape "
                         f"[N, ...] and prompts.json a list of N strings")
    return chosen, rejected, prompts


@OBJECTIVES.register("sft")
class SftObjective(_PreferenceBase):
    """Supervised fine-tuning on the best samples: the flow-matching loss on the ``top_k``
    highest-reward samples of each group (groups whose rewards are all equal are skipped), the
    baseline flow_grpo ships beside its DPO script. No reference, no ratio; ``train.beta``
    adds the velocity-MSE KL on the same draws.

    Args:
        top_k: samples kept per group (default 1).
    """

    anchored = False  # no old policy and no reference: the ratio-1 contract has no analogue

    def __init__(self, policy: Policy, top_k: int = 1, draws: int = 1,
                 timesteps: str = "uniform", weighting: str = "uniform", power: float = 0.25,
                 guidance: float | None = None) -> None:
        super().__init__(policy, draws, timesteps, weighting, power, guidance)
        integer("top_k", top_k, 1)
        self.top_k = top_k

    def selected(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B]`` bool: the ``top_k`` best samples of each group with distinct rewards."""
        groups, scores = batch.groups.cpu(), batch.reward.scores.float().cpu()
        keep = torch.zeros(len(groups), dtype=torch.bool)
        valid = None if batch.valid is None else batch.valid.cpu().bool()
        for g in torch.unique(groups).tolist():
            rows = (groups == g).nonzero().flatten()
            if valid is not None:
                rows = rows[valid[rows]]
            if len(rows) < 2 or bool(scores[rows].max() == scores[rows].min()):
                continue
            order = torch.sort(scores[rows], descending=True, stable=True).indices
            keep[rows[order[:self.top_k]]] = True
        return keep

    def prepare(self, batch, rows=None):
        keep = self.selected(batch)
        draws = self.draws(batch)
        ref_v = None
        if self.kl is not None:
            ref_v = self.reference_errors(batch, draws, keep.nonzero().flatten())[1]
        return draws, keep, ref_v

    def loss(self, batch, state, idx, unit):
        draws, keep, ref_v = state
        mine = idx[keep[idx.cpu()].to(idx.device)]
        if len(mine) == 0:
            e, _ = self.errors(batch, draws, idx[:1], unit)
            return add_kl((e * 0).sum(), {}, None, torch.ones(1), 0.0)
        e, v = self.errors(batch, draws, mine, unit)
        weight = batch.sample_weights[mine].to(e.device)
        loss = (e * weight).sum() / len(idx)
        kl = None if ref_v is None else self.kl_from(v, ref_v[mine.to(ref_v.device), unit],
                                                     len(mine))
        return add_kl(loss, {"train/sft_frac": torch.tensor(len(mine) / len(idx))}, kl,
                      weight, self.policy.beta)


__all__ = ["DgpoObjective", "DpoObjective", "SftObjective", "dpo_loss", "group_extremes",
           "load_preference_file"]
