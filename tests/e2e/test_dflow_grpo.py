"""dFlowGRPO on a tiny token model through the unchanged trainer: the ratio is 1 before the first
update for every path and option, changed-only steps score only the tokens that moved, the
Monte-Carlo estimator is the exact step's on average, and one update moves the policy the way
the advantages say."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.config.io import from_dict
from flowgrpo.rl import kl as kl_lib
from flowgrpo.training.trainer import Trainer, canonical_advantages
from helpers.tiny_discrete import tiny_digits_discrete_pipeline, tiny_discrete_trainer
from helpers.toy import assert_ratio_one


def trainer(tmp_path, path="masked", steps=4, **train) -> Trainer:
    return tiny_discrete_trainer(tmp_path, "dflow_grpo", path, steps, **train)


@pytest.mark.parametrize("path,params", [
    ("masked", {}), ("uniform", {}), ("metric", {}), ("masked", {"tokens": "changed"}),
    ("uniform", {"tokens": "changed"}), ("metric", {"estimator": "mc", "n_mc": 4}),
])
def test_the_ratio_is_one_before_the_first_update(tmp_path, path, params):
    t = trainer(tmp_path, path, objective_params=params, beta=0.05)
    assert t.sample(0).traj.num_trained == 3  # 4 steps, the last (into the data) excluded
    assert_ratio_one(t)


def prepared(t):
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    batch.advantages = canonical_advantages(adv, batch)
    return batch, t.objective.prepare(batch)


def test_changed_only_scores_the_tokens_that_moved(tmp_path):
    t = trainer(tmp_path, "uniform", objective_params={"tokens": "changed"})
    batch, state = prepared(t)
    idx = torch.arange(4)
    x, x_next, s, s_next, logits = t.objective._logits(batch, idx, 0, 0)
    tok = t.sampler.transition(logits, x, s, s_next).token_log_probs(x_next)
    changed = x_next != x
    assert bool(changed.any()) and not bool(changed.all())
    expected = (tok * changed).sum(1) / changed.sum(1).clamp_min(1)
    got = t.objective.replay(batch, idx, 0, 0, None, state).log_prob
    torch.testing.assert_close(got, expected)
    # the rollout recorded the mean over every token: the changed-only old log-probs differ
    assert not torch.allclose(state.old[:, 0, 0, 0], batch.traj.log_probs[:, 0])


def test_monte_carlo_estimate_is_unbiased_for_the_exact_metric_step(tmp_path):
    t = trainer(tmp_path, "metric", objective_params={"estimator": "mc", "n_mc": 256})
    batch, state = prepared(t)
    idx = torch.arange(4)
    x, x_next, s, s_next, logits = t.objective._logits(batch, idx, 0, 1)
    exact = t.sampler.transition(logits, x, s, s_next).token_log_probs(x_next).exp()
    from samplers.discrete import metric_mc_log_prob

    est = metric_mc_log_prob(logits, x, state.draws[idx, 0, 1], state.factors[idx, 0, 1]).exp()
    # per-token estimates scatter around the exact value; their mean over 256 tokens is close
    assert abs(float((est - exact).mean())) < 0.1 * float(exact.mean())


def test_draws_belong_to_the_sample_not_to_its_batch_position(tmp_path):
    t = trainer(tmp_path, "metric", objective_params={"estimator": "mc", "n_mc": 3})
    batch, _ = prepared(t)
    shape = (4, 1, 3, 64, 3)
    first = t.objective._uniforms(batch, shape)
    batch.index = batch.index.flip(0)
    assert torch.equal(t.objective._uniforms(batch, shape), first.flip(0))


def test_one_update_moves_the_policy_the_advantages_way(tmp_path):
    t = trainer(tmp_path, "masked", loss="clip", loss_params={"clip_low": 0.9, "clip_high": 10.0})
    batch, state = prepared(t)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    batch.advantages = canonical_advantages(adv, batch)
    state = t.objective.prepare(batch)
    before = {n: p.detach().clone() for n, p in t.adapter.transformer.named_parameters()}
    t.update(batch, batch.advantages, 0)
    changed = [n for n, p in t.adapter.transformer.named_parameters()
               if not torch.equal(before[n], p.detach())]
    assert changed and all("lora_" in n for n in changed)
    idx = torch.arange(4)
    with torch.no_grad():
        after = torch.stack([t.objective.replay(batch, idx, 0, j, None, state).log_prob
                             for j in range(batch.traj.num_trained)], 1).sum(1)
    moved = after - state.old[:, 0, :, 0].sum(1)
    assert float(moved[adv > 0].mean()) > float(moved[adv < 0].mean())


def test_ratio_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    k3 = kl_lib.get("ratio_k3")
    assert torch.equal(k3(kl_lib.KLInputs(logp=logp, ref_logp=logp)), torch.zeros(3))
    r = torch.tensor([0.5, 2.0, 1.1])
    got = k3(kl_lib.KLInputs(logp=logp + r.log(), ref_logp=logp))
    torch.testing.assert_close(got, (r - 1) - r.log())


@pytest.mark.parametrize("overrides,message", [
    ({"objective_params": {"estimator": "mc"}}, "estimator 'mc' estimates a metric"),
    ({"objective_params": {"tokens": "some"}}, "tokens"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        trainer(tmp_path, "masked", **overrides)


def test_a_gaussian_sampler_is_refused_for_a_token_model(tmp_path):
    folder = tmp_path / "m"
    tiny_digits_discrete_pipeline().save_pretrained(str(folder))
    cfg = from_dict({"model": {"family": "digits_discrete", "path": str(folder)},
                     "reward": {"name": "digit"}, "data": {"prompts": "digits"},
                     "sampler": {"name": "sde"},
                     "run": {"output_dir": str(tmp_path / "r"), "progress": False,
                             "tensorboard": False}})
    with pytest.raises(ValueError, match="steps in continuous states but the model generates"):
        Trainer.from_config(cfg, overwrite=True)
