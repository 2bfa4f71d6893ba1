"""Likelihood-free objectives (ELBO, AWM, DiffusionNFT), KL estimators and pruning in the
trainer, each tested for its defining property on the toy."""

from __future__ import annotations

import pytest
import torch

import samplers
from flowgrpo.rl import kl as kl_lib
from flowgrpo.rl.losses import LOSSES
from flowgrpo.rl.objectives.likelihood_free import draw, weighted_lp
from flowgrpo.rl.rollout import model_velocity
from flowgrpo.training.trainer import Trainer, canonical_advantages
from helpers.toy import assert_ratio_one, toy_trainer

ODE = ["sampler.name=ode", "sampler.params={}"]


def prepared(t: Trainer, adv: float | None = None):
    """One rollout batch with advantages (all equal to ``adv`` when given) and the objective's
    state, before any update."""
    batch = t.sample(0)
    got, _ = t.advantages(batch)
    batch.advantages = canonical_advantages(
        got if adv is None else torch.full((len(batch.groups),), adv), batch)
    return batch, t.objective.prepare(batch)


def grads(t: Trainer) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in t.params]
    for p in t.params:
        p.grad = None
    return out


def flow_matching_grads(t: Trainer, batch, draws, idx, ks, scale: float = 1.0) -> list:
    """The gradient of ``scale * mean_i mean_k ||v(x_t) - (eps - x0)||^2`` computed directly."""
    x0 = batch.traj.final[idx].float()
    total = 0.0
    for k in ks:
        t_k = draws.t[idx, k]
        eps = draws.noise[idx, k].float()
        x_t = (1 - t_k.reshape(-1, 1, 1, 1)) * x0 + t_k.reshape(-1, 1, 1, 1) * eps
        v = model_velocity(t.adapter, batch.traj.cond.index(idx), 1.0)(x_t, t_k)
        total = total + ((v - (eps - x0)) ** 2).flatten(1).mean(1).mean()
    (scale * total / len(ks)).backward()
    return grads(t)


@pytest.mark.parametrize("objective", ["elbo", "awm", "nft"])
def test_likelihood_free_objectives_train_from_ode_rollouts_with_ratio_one(tmp_path, objective):
    t = toy_trainer(tmp_path, f"train.objective={objective}", *ODE, "train.beta=0.01")
    assert t.objective.needs_transitions is False
    metrics = assert_ratio_one(t)
    assert "rollout/adv_abs_mean" in metrics
    assert t.sample(0).traj.num_trained == 0  # deterministic rollouts: nothing per step


def test_elbo_gradient_is_minus_the_flow_matching_gradient_on_the_same_draws(tmp_path):
    t = toy_trainer(tmp_path, "train.objective=elbo", *ODE,
                    "train.objective_params={weighting: uniform, draws: 3}")
    batch, (draws, _) = prepared(t)
    idx = torch.arange(6)
    t.objective.log_likelihoods(batch, draws, idx)[0].mean(1).mean().backward()
    elbo = grads(t)
    fm = flow_matching_grads(t, batch, draws, idx, range(3))
    assert any(g.abs().sum() > 0 for g in fm)
    for a, b in zip(elbo, fm):
        torch.testing.assert_close(a, -b, atol=1e-7, rtol=1e-4)


def test_elbo_estimator_variance_falls_like_one_over_k(tmp_path):
    t = toy_trainer(tmp_path, "train.objective=elbo", *ODE)
    batch = t.sample(0)
    x0 = batch.traj.final[:1].float().expand(1600, -1, -1, -1)
    draws = draw(x0, 1, "uniform", torch.Generator().manual_seed(0))
    velocity = model_velocity(t.adapter, batch.traj.cond.index([0] * 1600), 1.0)
    eps, t_k = draws.noise[:, 0], draws.t[:, 0]
    with torch.no_grad():
        x_t = (1 - t_k.reshape(-1, 1, 1, 1)) * x0 + t_k.reshape(-1, 1, 1, 1) * eps
        lp = weighted_lp(velocity(x_t, t_k) - (eps - x0), t_k, "adaptive")
    var = {k: lp.reshape(-1, k).mean(1).var().item() for k in (1, 4, 16)}
    assert 3.0 < var[1] / var[4] < 5.3, var
    assert 10 < var[1] / var[16] < 24, var


@pytest.mark.slow
def test_awm_is_the_flow_matching_gradient_with_unit_advantages_and_none_with_zero(tmp_path):
    t = toy_trainer(tmp_path, "train.objective=awm", *ODE,
                    "train.objective_params={weighting: uniform, draws: 2}")
    batch, state = prepared(t, adv=1.0)
    idx = torch.arange(16)
    for k in range(2):
        (t.objective.loss(batch, state, idx, k)[0] / 2).backward()
    awm = grads(t)
    fm = flow_matching_grads(t, batch, state[0], idx, range(2))
    for a, b in zip(awm, fm):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
    batch.advantages = torch.zeros_like(batch.advantages)
    t.objective.loss(batch, state, idx, 0)[0].backward()
    assert all(g.abs().max() == 0 for g in grads(t))


def test_nft_gradient_is_zero_at_half_optimality_and_b_times_flow_matching_at_one(tmp_path):
    t = toy_trainer(tmp_path, "train.objective=nft", *ODE,
                    "train.objective_params={weighting: uniform, draws: 1, strength: 0.3}")
    batch, state = prepared(t, adv=0.0)  # r = 1/2 for every sample
    idx = torch.arange(16)
    t.objective.loss(batch, state, idx, 0)[0].backward()
    assert all(g.abs().max() < 1e-9 for g in grads(t))
    batch.advantages = torch.full_like(batch.advantages, 5.0)  # adv_max: r = 1
    t.objective.loss(batch, state, idx, 0)[0].backward()
    nft = grads(t)
    fm = flow_matching_grads(t, batch, state[0], idx, [0], scale=0.3)
    assert any(g.abs().sum() > 0 for g in fm)
    for a, b in zip(nft, fm):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_nft_old_policy_lags_by_its_ema_and_survives_a_resume(tmp_path):
    args = ["train.objective=nft", *ODE, "run.epochs=2", "run.save_every=2", "run.eval_every=0",
            "train.objective_params={draws: 1, decay_rate: 0.25}"]
    t = toy_trainer(tmp_path, *args)
    t.train()
    old = t.objective.state_dict()
    assert int(old["iterations"]) == 2
    # eta = 0 after the first iteration (old = theta), 0.25 after the second: old != theta now
    current = [p.detach() for p in t.params]
    assert any(not torch.equal(old[f"old.{i}"], p) for i, p in enumerate(current))
    resumed = Trainer.from_config(t.cfg, resume="auto")
    assert resumed.start_epoch == 2
    again = resumed.objective.state_dict()
    assert all(torch.equal(old[k], again[k]) for k in old)


def test_kl_estimators_against_hand_computations():
    mean, ref, std = torch.full((2, 3), 0.5), torch.zeros(2, 3), torch.full((2, 1), 0.5)
    inputs = kl_lib.KLInputs(mean=mean, ref_mean=ref, std=std, dt=-0.1)
    exact = kl_lib.get("exact")(inputs)
    torch.testing.assert_close(exact, torch.full((2,), 0.25 / (2 * 0.25)))
    torch.testing.assert_close(kl_lib.get("flow_grpo")(inputs), exact * 0.1)
    torch.testing.assert_close(kl_lib.get("x_mse")(inputs), torch.full((2,), 0.25))
    v = kl_lib.KLInputs(v=torch.ones(2, 4), ref_v=torch.zeros(2, 4),
                        logp=torch.tensor([0.0, -1.0]), ref_logp=torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(kl_lib.get("velocity_mse")(v), torch.ones(2))
    log_ratio = kl_lib.get("log_ratio")(v)
    assert log_ratio[0] == 0 and log_ratio[1] == pytest.approx(torch.e - 2)
    with pytest.raises(ValueError, match="needs mean"):
        kl_lib.get("exact")(v)


def test_flow_grpo_kl_is_the_exact_kl_times_the_step(tmp_path):
    exact = toy_trainer(tmp_path / "a", "train.beta=0.01")
    ported = toy_trainer(tmp_path / "b", "train.beta=0.01", "train.kl=flow_grpo")
    with torch.no_grad():  # a policy away from the reference, the same in both
        for a, b in zip(exact.params, ported.params):
            a.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
            b.copy_(a)
    batch = exact.sample(0)
    idx, j = torch.arange(4), 2
    k = int(batch.traj.trained[0, j])
    dt = float(batch.traj.sigmas[k] - batch.traj.sigmas[k + 1])
    from flowgrpo.rl.replay import replay_step

    one = replay_step(exact.adapter, exact.sampler, batch.traj, idx, j, 1.0, kl=exact.objective.kl)
    two = replay_step(ported.adapter, ported.sampler, batch.traj, idx, j, 1.0,
                      kl=ported.objective.kl)
    assert (one.kl > 0).all()
    torch.testing.assert_close(two.kl, one.kl * dt)


def test_dppo_prunes_training_forwards_and_reweights_the_kept_samples(tmp_path):
    t = toy_trainer(tmp_path, "train.pruner=dppo", "train.beta=0",
                    "train.pruner_params={group_rate: 0.5, sample_rate: 0.5}")
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    before = t.calls.epoch["grad"]
    out = t.update(batch, adv, 0)
    grad_calls = t.calls.epoch["grad"] - before
    assert 0 < out["train/pruned_frac"] < 1
    kept = round(16 * (1 - out["train/pruned_frac"]))
    assert out["train/samples"] == kept
    assert grad_calls == kept * batch.traj.num_trained  # the pruned forwards are saved
    weights = batch.sample_weights
    assert (weights > 0).sum() == kept
    # kept samples carry 1/p (>= 1, > 1 where a level pruned), scaled by kept / candidates
    inverse_p = weights[weights > 0] * 16 / kept
    assert inverse_p.min() >= 1 - 1e-6 and inverse_p.max() > 1


def test_config_refuses_a_deterministic_sampler_for_the_ratio_objective():
    from flowgrpo.config.io import load_config
    from flowgrpo.errors import ConfigError

    with pytest.raises(ConfigError, match="likelihood-free objective"):
        load_config(None, ODE)
    with pytest.raises(ConfigError, match="no stochastic steps"):
        load_config(None, [*ODE, "train.objective=elbo", "train.step_selection=flash"])
    assert not samplers.get("ode").trainable(1.0, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES.names())
def test_elbo_plugs_into_every_policy_loss(tmp_path, loss):
    t = toy_trainer(tmp_path, "train.objective=elbo", *ODE, f"train.loss={loss}",
                    "train.loss_params={}", "train.objective_params={draws: 1}")
    batch, state = prepared(t)
    total, metrics = t.objective.loss(batch, state, torch.arange(16), None)
    assert torch.isfinite(total) and abs(float(metrics["train/ratio_mean"]) - 1) <= 1e-6
    total.backward()
    assert any(g.abs().sum() > 0 for g in grads(t))


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["elbo", "nft"])
def test_likelihood_free_objective_raises_the_eval_reward_from_the_cli(tmp_path, objective):
    from flowgrpo.cli.main import main
    from flowgrpo.run.tracking import read_metrics

    assert main(["train", "--set", f"train.objective={objective}", "--set", "sampler.name=ode",
                 "--set", "sampler.params={}", "--set", "run.epochs=20",
                 "--set", "run.eval_every=20", "--set", f"run.output_dir={tmp_path}",
                 "--set", "run.progress=false", "--set", "run.save_every=0"]) == 0
    evals = [r["eval/reward"] for r in read_metrics(tmp_path) if "eval/reward" in r]
    assert len(evals) == 2 and evals[1] > evals[0] + 0.03, evals


def test_config_refuses_per_step_or_per_view_credit_for_likelihood_free_objectives():
    from flowgrpo.config.io import load_config
    from flowgrpo.errors import ConfigError

    for extra in ("train.views=1", "train.credit=turning_point"):
        with pytest.raises(ConfigError, match="one outcome advantage per sample"):
            load_config(None, ["train.objective=nft", extra])


def test_pruned_samples_cost_no_old_policy_forwards(tmp_path):
    t = toy_trainer(tmp_path, "train.objective=elbo", *ODE, "train.beta=0", "train.pruner=dppo",
                    "train.objective_params={draws: 2}")
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    before = dict(t.calls.epoch)
    out = t.update(batch, adv, 0)
    kept = round(16 * (1 - out["train/pruned_frac"]))
    assert 0 < kept < 16
    assert t.calls.epoch["nograd"] - before["nograd"] == kept * 2  # old log-likelihoods
    assert t.calls.epoch["grad"] - before["grad"] == kept * 2
