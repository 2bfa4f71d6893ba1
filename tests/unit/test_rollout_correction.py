"""Rollout correction of the ratio objective: where PPO's old log-probs come from
(``train.objective_params.old_log_probs``) and what each choice costs and guarantees."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.rl.objectives import OBJECTIVES
from flowgrpo.rl.replay import replay_step
from flowgrpo.training.trainer import Trainer, canonical_advantages
from helpers.tiny_runs import make_config
from helpers.toy import assert_ratio_one


def trainer(tiny_sd3_dir, tmp_path, reward, mode, **objective):
    """Rollouts with CFG 3 on the tiny SD3; ``objective`` params on top of ``old_log_probs``."""
    return Trainer.from_config(make_config(
        tiny_sd3_dir, tmp_path, reward, model={"guidance": 3.0},
        train={"objective_params": {"old_log_probs": mode, **objective}, "beta": 0.0}))


def prepared(t: Trainer):
    batch = t.sample(0)
    batch.advantages = canonical_advantages(t.advantages(batch)[0], batch)
    t.calls.take()
    state = t.objective.prepare(batch)
    return batch, state, t.calls.take()["calls/nograd"]


@pytest.mark.parametrize("mode", ["bypass", "reject", "recompute", "auto"])
def test_ratio_is_one_under_the_rollouts_own_conditions(tiny_sd3_dir, tmp_path,
                                                        brightness_reward, mode):
    assert_ratio_one(trainer(tiny_sd3_dir, tmp_path, brightness_reward, mode))


def test_bypass_spends_no_call_on_old_log_probs_and_recompute_one_per_step(
        tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer(tiny_sd3_dir, tmp_path, brightness_reward, "bypass", guidance=1.0)
    batch, state, calls = prepared(t)
    assert calls == 0
    torch.testing.assert_close(state[:, 0, :, 0], batch.traj.log_probs, rtol=0, atol=0)
    t = trainer(tiny_sd3_dir, tmp_path / "b", brightness_reward, "recompute", guidance=1.0)
    batch, _, calls = prepared(t)
    assert calls == len(batch.groups) * batch.traj.num_trained  # unguided: one row each


def test_bypass_first_ratio_is_the_importance_ratio_of_cfg_free_training(
        tiny_sd3_dir, tmp_path, brightness_reward):
    """Rollouts guided (CFG 3), training unguided: under bypass the first-update ratio is
    pi_unguided / pi_guided of the stored transition, not 1 (recompute makes it 1)."""
    t = trainer(tiny_sd3_dir, tmp_path, brightness_reward, "bypass", guidance=1.0)
    batch, state, _ = prepared(t)
    idx = torch.arange(len(batch.groups))
    unguided = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 1.0).log_prob.detach()
    guided = batch.traj.log_probs[:, 0]
    _, out = t.objective.loss(batch, state, idx, (0, 0))
    ratio = torch.exp(unguided - guided)
    assert (ratio - 1).abs().max() > 1e-3  # the two policies differ on the tiny model
    assert float(out["train/ratio_max"]) == pytest.approx(float(ratio.max()), rel=1e-5)
    assert float(out["train/ratio_min"]) == pytest.approx(float(ratio.min()), rel=1e-5)


def test_reject_leaves_out_steps_whose_importance_ratio_is_out_of_bounds(
        tiny_sd3_dir, tmp_path, brightness_reward):
    t = trainer(tiny_sd3_dir, tmp_path, brightness_reward, "reject", guidance=1.0,
                reject_bound=1.0 + 1e-6)
    batch, state, _ = prepared(t)
    idx = torch.arange(len(batch.groups))
    unguided = replay_step(t.adapter, t.sampler, batch.traj, idx, 0, 1.0).log_prob.detach()
    ratio = torch.exp(unguided - batch.traj.log_probs[:, 0])
    expected = ((ratio > 1 + 1e-6) | (ratio < 1 / (1 + 1e-6))).float().mean()
    loss, out = t.objective.loss(batch, state, idx, (0, 0))
    assert float(out["train/rejected_frac"]) == pytest.approx(float(expected))
    assert float(expected) > 0
    if float(expected) == 1:  # every step rejected: no policy gradient at all
        loss.backward()
        assert all(p.grad is None or p.grad.abs().max() == 0 for p in t.params)
    # a bound no ratio reaches rejects nothing and is bypass exactly
    wide = trainer(tiny_sd3_dir, tmp_path / "w", brightness_reward, "reject", guidance=1.0,
                   reject_bound=1e9)
    batch_w, state_w, _ = prepared(wide)
    _, out_w = wide.objective.loss(batch_w, state_w, idx, (0, 0))
    assert float(out_w["train/rejected_frac"]) == 0


def test_bad_rollout_correction_settings_are_one_line_errors(tiny_sd3_dir, tmp_path,
                                                            brightness_reward):
    t = trainer(tiny_sd3_dir, tmp_path, brightness_reward, "auto")
    policy = t.objective.policy
    with pytest.raises(ValueError, match="old_log_probs"):
        OBJECTIVES.build("ratio", policy, old_log_probs="skip")
    for bound in (1.0, 0.5, float("inf")):
        with pytest.raises(ValueError, match="reject_bound must be"):
            OBJECTIVES.build("ratio", policy, old_log_probs="reject", reject_bound=bound)
