"""The methods built on the general core: Flash-GRPO, TurningPoint-GRPO and MV-GRPO, each tested
for its defining property."""

from __future__ import annotations

import pytest
import torch

import samplers
from flowgrpo.rl import step_selection as steps
from helpers.toy import lora, toy_trainer
from samplers.analytic import GaussianFlow


@pytest.mark.slow
def test_flash_trains_one_shared_step_per_group_varying_across_groups_and_iterations(tmp_path):
    t = toy_trainer(tmp_path, "train.step_selection=flash", "train.batch_size=32")
    seen = set()
    for epoch in range(3):
        batch = t.sample(epoch)
        assert batch.traj.trained.shape == (32, 1)
        for g in batch.groups.unique():
            chosen = batch.traj.trained[batch.groups == g, 0]
            assert (chosen == chosen[0]).all()  # iso-temporal: the group shares its step
            seen.add((epoch, int(chosen[0])))
        # the samples of a group are stochastic at their step only (see test_core), and the
        # stored log-prob is the one of that step
        assert torch.isfinite(batch.traj.log_probs).all() and (batch.traj.log_probs != 0).all()
    assert len({k for _, k in seen}) >= 4  # steps vary across groups and iterations
    again = toy_trainer(tmp_path / "again", "train.step_selection=flash", "train.batch_size=32")
    assert torch.equal(again.sample(2).traj.trained, t.sample(2).traj.trained)  # resumable


def rectified_gradient_norms(rectify: bool, sampler_name: str = "sde") -> list[float]:
    """Per-step norms of d(w_k * logp_k)/d(theta) on the analytic bed, with the velocity
    ``v = v_exact + theta`` and ``w_k`` the flash weight (1 without rectification)."""
    flow = GaussianFlow(mu=0.5, c=0.5)
    sampler = samplers.get(sampler_name)
    sigmas = torch.linspace(1, 0, 11)
    sigmas = 3 * sigmas / (1 + 2 * sigmas)  # SD3's shift 3: the step sizes differ a lot
    selection = steps.FlashSteps(rectify=rectify)
    candidates = steps.trainable_steps(sampler, sigmas)
    weights = selection.weights(sigmas, torch.tensor([candidates]), sampler)[0]
    gen = torch.Generator().manual_seed(0)
    norms = []
    for k, w in zip(candidates, weights.tolist()):
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        mean, var = flow.marginal(s)
        x = mean + var**0.5 * torch.randn(1, 40_000, generator=gen)
        theta = torch.zeros_like(x, requires_grad=True)
        tr = sampler.transition(flow.velocity(x, s) + theta, x, s, s_next)
        x_next = samplers.sample_next(tr, generator=gen).detach()
        (w * samplers.gaussian_log_prob(x_next, tr.mean, tr.std)).sum().backward()
        norms.append(float(theta.grad.norm()))
    return norms


def test_flash_rectification_equalises_per_step_gradient_norms_on_the_analytic_bed():
    for name in ("sde", "cps", "langevin"):
        raw = rectified_gradient_norms(rectify=False, sampler_name=name)
        rectified = rectified_gradient_norms(rectify=True, sampler_name=name)
        assert max(raw) / min(raw) > 2, (name, raw)  # without it the scale varies a lot
        # with it, only the noise draw's norm varies: ||eps|| / sqrt(D) = 1 +- 1%
        assert max(rectified) / min(rectified) < 1.03, (name, rectified)


def test_flash_weight_is_flow_grpo_sde_closed_form():
    """For Flow-GRPO's SDE the weight is 1 / (sqrt(-dt) (1 + g^2 (1 - s) / (2 s)) / g)."""
    sampler = samplers.get("sde", noise_level=0.7)
    sigmas = torch.linspace(1, 0, 11)
    table = steps.rectification(sampler, sigmas, list(range(1, 9)))
    for k, w in table.items():
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        g = 0.7 * (s / (1 - s)) ** 0.5
        dt = s_next - s
        want = g / ((-dt) ** 0.5 * (1 + g * g * (1 - s) / (2 * s)))
        assert abs(w - want) < 1e-4 * want, (k, w, want)


def test_turning_point_advantages_are_per_step_with_zero_mean_per_group(tmp_path):
    t = toy_trainer(tmp_path, "train.credit=turning_point")
    batch = t.sample(0)
    rollout_calls = t.calls.epoch["nograd"]
    adv, metrics = t.advantages(batch)
    steps_per_sample = batch.traj.num_trained
    assert adv.shape == (16, 1, steps_per_sample, 1)
    for g in batch.groups.unique():
        means = adv[batch.groups == g, 0, :, 0].mean(0)
        assert means.abs().max() < 1e-5
    assert adv.abs().sum() > 0
    # completions: R_0 from step 0 and R_j from step j (j < J), each to the end of the
    # 10-step schedule, for all 16 samples, counted as model calls without gradient
    completions = sum(10 - k for k in range(steps_per_sample))
    assert t.calls.epoch["nograd"] - rollout_calls == 16 * completions
    assert 0 <= metrics["credit/turning_frac"] <= 1


@pytest.mark.slow
def test_turning_point_run_trains_from_the_cli(tmp_path):
    from flowgrpo.cli.main import main
    from flowgrpo.run.tracking import read_metrics

    assert main(["train", "--set", f"run.output_dir={tmp_path}", "--set", "run.epochs=2",
                 "--set", "train.credit=turning_point", "--set", "train.batch_size=16",
                 "--set", "run.eval_every=2", "--set", "run.progress=false",
                 "--set", "data.eval_images_per_prompt=1"]) == 0
    rows = read_metrics(tmp_path)
    assert rows[-1]["calls/grad"] > 0 and rows[-1]["calls/nograd"] > rows[-1]["calls/grad"]


@pytest.mark.slow
def test_a_view_identical_to_the_prompt_gives_plain_grpo_loss_and_gradient(tmp_path):
    identity = ['train.enhancer_params={templates: ["{prompt}"]}']
    plain = toy_trainer(tmp_path / "plain")
    multi = toy_trainer(tmp_path / "multi", "train.views=1", *identity)
    batch_plain, batch_multi = plain.sample(0), multi.sample(0)
    multi.views.extend(multi.session, multi.rewards.score, batch_multi, 0)
    assert len(batch_multi.views) == 2
    torch.testing.assert_close(batch_multi.view_rewards[1].scores, batch_plain.reward.scores)
    adv_plain, _ = plain.advantages(batch_plain)
    adv_multi, _ = multi.advantages(batch_multi)
    assert adv_multi.shape == (16, 2, 1, 1)
    got, want = multi.update(batch_multi, adv_multi, 0), plain.update(batch_plain, adv_plain, 0)
    for key in ("train/loss", "train/ratio_mean", "train/clipfrac"):
        assert abs(got[key] - want[key]) < 1e-6, key
    a, b = lora(multi), lora(plain)
    assert all(torch.allclose(a[k], b[k], atol=1e-7, rtol=0) for k in a)
    assert any(not torch.equal(a[k], lora(toy_trainer(tmp_path / "base"))[k]) for k in a)


def test_views_rescore_the_same_samples_under_other_captions(tmp_path):
    captions = ['train.enhancer_params={templates: ["{prompt}, thick strokes"]}']
    t = toy_trainer(tmp_path, "train.views=2", *captions)
    batch = t.sample(0)
    final = batch.traj.final.clone()
    t.views.extend(t.session, t.rewards.score, batch, 0)
    assert torch.equal(batch.traj.final, final)  # nothing regenerated
    assert len(batch.views) == len(batch.view_rewards) == 3
    first = batch.prompts[0]
    view_prompts = t.views.captions(batch.prompts, 0)
    assert view_prompts[0] == batch.prompts
    assert view_prompts[1][0] == view_prompts[2][0] == f"{first}, thick strokes"
    adv, _ = t.advantages(batch)
    assert adv.shape == (16, 3, 1, 1)
