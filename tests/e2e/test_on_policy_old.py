"""``old_log_probs: on_policy`` of the ratio-based likelihood-free objectives: the old
log-likelihoods come from the training forward itself, so no call is spent on them, and when
each sample is trained in one optimizer step the update is the recomputing one."""

from __future__ import annotations

import pytest
import torch

from helpers.toy import lora, toy_trainer

ODE = ["sampler.name=ode", "sampler.params={}", "train.beta=0"]


def one_epoch(tmp_path, objective: str, mode: str):
    t = toy_trainer(tmp_path, *ODE, f"train.objective={objective}",
                    f"train.objective_params={{old_log_probs: {mode}}}")
    t.before = lora(t)
    batch = t.sample(0)
    t.calls.take()
    adv, _ = t.advantages(batch)
    metrics = t.update(batch, adv, 0)
    return t, metrics, t.calls.take()


@pytest.mark.parametrize("objective", ["elbo", "awm"])
def test_on_policy_old_log_likelihoods_give_the_recomputed_update_without_its_calls(
        tmp_path, objective):
    slow, m_slow, c_slow = one_epoch(tmp_path / "r", objective, "recompute")
    fast, m_fast, c_fast = one_epoch(tmp_path / "o", objective, "on_policy")
    assert slow.cfg.train.num_inner_epochs == 1
    assert (slow.cfg.train.train_batch_size or slow.cfg.train.batch_size) >= \
        slow.cfg.train.batch_size  # one minibatch: each sample trains in one optimizer step
    trained = int(m_slow["train/samples"])
    assert trained > 0
    assert c_slow["calls/nograd"] - c_fast["calls/nograd"] == trained * slow.objective.k
    assert c_slow["calls/grad"] == c_fast["calls/grad"]
    a, b = lora(slow), lora(fast)
    assert any((a[n] - w).abs().max() > 0 for n, w in slow.before.items())  # it moved
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)
    assert m_fast["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m_fast["train/loss"] == pytest.approx(m_slow["train/loss"], rel=1e-5, abs=1e-7)


def test_on_policy_refuses_the_ema_old_policy_and_unknown_modes(tmp_path):
    from flowgrpo.rl.objectives import OBJECTIVES

    t = toy_trainer(tmp_path, *ODE, "train.objective=elbo")
    with pytest.raises(ValueError, match="old_policy: ema"):
        OBJECTIVES.build("elbo", t.objective.policy, old_log_probs="on_policy",
                         old_policy="ema")
    with pytest.raises(ValueError, match="old_log_probs"):
        OBJECTIVES.build("awm", t.objective.policy, old_log_probs="bypass")
