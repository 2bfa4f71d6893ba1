"""The options that reproduce the authors' code in the likelihood-free objectives and the clip
loss, each tested for its defining property on the toy (tiny batches, no training loop)."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.rl.losses import LOSSES
from flowgrpo.rl.objectives.base import OBJECTIVES
from flowgrpo.training.trainer import canonical_advantages
from helpers.toy import assert_ratio_one, toy_trainer

SMALL = ["train.batch_size=8", "sampler.num_steps=4", "sampler.name=ode", "sampler.params={}",
         "train.beta=0"]


def trainer(tmp_path, objective: str, params: str = "{draws: 2}"):
    return toy_trainer(tmp_path, *SMALL, f"train.objective={objective}",
                       f"train.objective_params={params}")


def prepared(t, epoch: int = 0):
    batch = t.sample(epoch)
    adv, _ = t.advantages(batch)
    batch.advantages = canonical_advantages(adv, batch)
    return batch, t.objective.prepare(batch)


def perturb(t, scale: float = 0.05) -> list[torch.Tensor]:
    """Move the trainable weights as an update would; return the weights before."""
    before = [p.detach().clone() for p in t.params]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in t.params:
            p.add_(scale * torch.randn(p.shape, generator=gen).to(p))
    return before


def test_nft_scale_by_adv_max_multiplies_the_loss_by_adv_max_over_b(tmp_path):
    t = trainer(tmp_path, "nft", "{draws: 1, strength: 0.3}")
    batch, state = prepared(t)
    idx = torch.arange(len(batch.groups))
    plain = t.objective.loss(batch, state, idx, 0)[0].detach()
    scaled_obj = OBJECTIVES.build("nft", t.objective.policy, draws=1, strength=0.3,
                                  scale_by_adv_max=True)
    scaled = scaled_obj.loss(batch, state, idx, 0)[0]
    assert float(plain.abs()) > 0
    torch.testing.assert_close(scaled, plain * (5.0 / 0.3), rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="scale_by_adv_max"):
        OBJECTIVES.build("nft", t.objective.policy, scale_by_adv_max="yes")


@pytest.mark.parametrize("objective", ["awm", "elbo"])
def test_adv_scale_scales_the_advantage(tmp_path, objective):
    t = trainer(tmp_path, objective)
    batch, state = prepared(t)
    batch.advantages = batch.advantages.abs() + 0.5  # a mean far from 0 (ratio 1: -mean A)
    idx = torch.arange(len(batch.groups))
    unit = t.objective.units(batch)[0]
    plain = t.objective.loss(batch, state, idx, unit)[0]
    scaled_obj = OBJECTIVES.build(objective, t.objective.policy, draws=2, adv_scale=0.2)
    scaled = scaled_obj.loss(batch, state, idx, unit)[0]  # AWM's advantage_max 1 / clip 5
    assert float(plain.abs()) > 0
    torch.testing.assert_close(scaled, 0.2 * plain, rtol=1e-5, atol=1e-12)


def test_awm_ema_pull_is_the_velocity_mse_to_the_ema_copy_which_moves_and_is_checkpointed(
        tmp_path):
    t = trainer(tmp_path, "awm", "{draws: 2, ema_beta: 1.0, ema_decay_rate: 0.1}")
    obj = t.objective
    batch, state = prepared(t)
    idx = torch.arange(len(batch.groups))
    # the copy starts equal to the weights: no pull at the first update
    _, metrics = obj.loss(batch, state, idx, 1)
    assert float(metrics["train/ema_pull"]) < 1e-12
    before = perturb(t)
    loss, metrics = obj.loss(batch, state, idx, 1)
    draws = state[0]
    with torch.no_grad():
        v_now = obj.velocities(batch, draws, idx, torch.tensor([1]))[0]
        moved = [p.detach().clone() for p in t.params]
        for p, b in zip(t.params, before):
            p.copy_(b)
        v_ema = obj.velocities(batch, draws, idx, torch.tensor([1]))[0]
        for p, m in zip(t.params, moved):
            p.copy_(m)
    by_hand = ((v_now - v_ema) ** 2).flatten(1).mean(1).mean()
    assert float(by_hand) > 0
    torch.testing.assert_close(metrics["train/ema_pull"], by_hand, rtol=1e-4, atol=1e-10)
    obj.ema_beta = 0.0  # the pull's weight enters the loss linearly
    torch.testing.assert_close(obj.loss(batch, state, idx, 1)[0], loss - by_hand, rtol=1e-4,
                               atol=1e-8)
    obj.after_update()  # eta = min(0.1 * 1, 0.3): copy = 0.1 before + 0.9 now
    saved = obj.state_dict()
    assert int(saved["iterations"]) == 1
    for i, (b, m) in enumerate(zip(before, moved)):
        torch.testing.assert_close(saved[f"ema.{i}"], 0.1 * b.float() + 0.9 * m.float())
    fresh = OBJECTIVES.build("awm", obj.policy, ema_beta=1.0)
    fresh.load_state_dict(saved)
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    assert OBJECTIVES.build("awm", obj.policy).state_dict() == {}  # the default keeps no copy


def test_clip_range_one_is_the_unclipped_ratio_below_two():
    gen = torch.Generator().manual_seed(0)
    logp_old = torch.randn(64, generator=gen)
    logp = (logp_old + 0.5 * torch.randn(64, generator=gen)).clamp(max=logp_old + 0.69)
    adv = torch.randn(64, generator=gen)
    out = {}
    for name, params in (("clip", {"clip_low": 1.0, "clip_high": 1.0}), ("unclipped", {})):
        x = logp.clone().requires_grad_(True)
        loss, metrics = LOSSES.get(name)(x, logp_old, adv, **params)
        loss.backward()
        out[name] = (loss.detach(), x.grad, metrics["train/clipfrac"])
    torch.testing.assert_close(out["clip"][0], out["unclipped"][0])
    torch.testing.assert_close(out["clip"][1], out["unclipped"][1])
    ratio = (logp - logp_old).exp()
    torch.testing.assert_close(out["unclipped"][1], -adv * ratio / 64)
    assert float(out["clip"][2]) == 0 and float(out["unclipped"][2]) == 0
    with pytest.raises(ValueError, match="clip_low must be in \\[0, 1\\]"):
        LOSSES.get("clip")(logp, logp_old, adv, clip_low=1.01)


@pytest.mark.parametrize(("weighting", "power"), [("adaptive", 1), ("uniform", 2)])
def test_elbo_cfg_division_divides_every_log_likelihood_by_the_guidance(tmp_path, weighting,
                                                                        power):
    t = trainer(tmp_path, "elbo", f"{{draws: 2, weighting: {weighting}, guidance: 2.5}}")
    batch, (draws, _) = prepared(t)
    idx = torch.arange(len(batch.groups))
    divided = OBJECTIVES.build("elbo", t.objective.policy, draws=2, weighting=weighting,
                               guidance=2.5, cfg_division=True)
    with torch.no_grad():
        plain = t.objective.log_likelihoods(batch, draws, idx)[0]
        got = divided.log_likelihoods(batch, draws, idx)[0]
    assert float(plain.abs().min()) > 0
    torch.testing.assert_close(got, plain / 2.5**power, rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="cfg_division"):
        OBJECTIVES.build("elbo", t.objective.policy, weighting="x0", cfg_division=True)


def test_elbo_ema_old_policy_ratio_is_one_first_then_the_lag_to_the_ema(tmp_path):
    t = trainer(tmp_path, "elbo", "{draws: 2, old_policy: ema, decay_rate: 0.5}")
    obj = t.objective
    assert_ratio_one(t)  # the very first iteration: the copy equals the weights
    before = perturb(t)  # an iteration's updates
    moved = [p.detach().clone() for p in t.params]
    obj.after_update()  # eta = min(0.5 * 1, 0.5)
    batch, state = prepared(t, epoch=1)  # rolled out by, and old lps under, the copy
    draws, old = state
    idx = torch.arange(len(batch.groups))
    _, metrics = obj.loss(batch, state, idx, None)
    with torch.no_grad():
        lp_now = obj.log_likelihoods(batch, draws, idx)[0].mean(1)
        for p, b, m in zip(t.params, before, moved):
            p.copy_(0.5 * b + 0.5 * m)
        lp_ema = obj.log_likelihoods(batch, draws, idx)[0].mean(1)
        for p, m in zip(t.params, moved):
            p.copy_(m)
    torch.testing.assert_close(old, lp_ema, rtol=1e-5, atol=1e-7)
    ratio = (lp_now - lp_ema).exp()
    assert float((ratio - 1).abs().max()) > 1e-4  # not 1 at this epoch's first update
    torch.testing.assert_close(metrics["train/ratio_mean"], ratio.mean(), rtol=1e-5, atol=0)
    torch.testing.assert_close(metrics["train/ratio_max"], ratio.max(), rtol=1e-5, atol=0)
    saved = obj.state_dict()
    assert int(saved["iterations"]) == 1 and "old.0" in saved
    current = OBJECTIVES.build("elbo", obj.policy)
    assert current.state_dict() == {}  # old_policy: current keeps no copy
