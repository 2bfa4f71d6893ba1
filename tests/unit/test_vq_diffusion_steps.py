"""The ``vq_diffusion`` sampler's step is the reverse step of diffusers' ``VQDiffusionScheduler``:
its tables, its posterior and its normalised distribution, scored and drawn as a Categorical."""

from __future__ import annotations

import pytest
import torch

import samplers
from samplers.vq_diffusion import MaskReplaceSchedule, gumbel_draw, log_posterior

diffusers = pytest.importorskip("diffusers")

CLASSES, STEPS = 7, 20  # 6 codes and the mask


def scheduler():
    return diffusers.VQDiffusionScheduler(num_vec_classes=CLASSES, num_train_timesteps=STEPS)


class Chain:
    """A stand-in model that exposes a mask-and-replace chain (what ``bind`` reads)."""

    state_space = samplers.TOKENS

    def __init__(self) -> None:
        self.mask_replace_schedule = MaskReplaceSchedule.linear(CLASSES, STEPS)


def inputs(seed=0, batch=3, length=10):
    g = torch.Generator().manual_seed(seed)
    log_p0 = torch.log_softmax(3 * torch.randn(batch, length, CLASSES - 1, generator=g), -1)
    x_t = torch.randint(0, CLASSES, (batch, length), generator=g)
    x_t[:, :3] = CLASSES - 1  # some masks on every row
    return log_p0, x_t


def test_tables_are_the_schedulers():
    ours, theirs = MaskReplaceSchedule.linear(CLASSES, STEPS), scheduler()
    for mine, name in [("log_a", "log_at"), ("log_b", "log_bt"), ("log_c", "log_ct"),
                       ("log_abar", "log_cumprod_at"), ("log_bbar", "log_cumprod_bt"),
                       ("log_cbar", "log_cumprod_ct")]:
        torch.testing.assert_close(getattr(ours, mine), getattr(theirs, name)[:STEPS],
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("t", [1, 2, 10, STEPS - 1])
def test_posterior_is_the_schedulers(t):
    log_p0, x_t = inputs(t)
    ours = log_posterior(log_p0, x_t, t, MaskReplaceSchedule.linear(CLASSES, STEPS))
    theirs = scheduler().q_posterior(log_p0.transpose(1, 2), x_t, t).transpose(1, 2)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    # a normalised prediction gives a normalised step (the chain is a Markov chain)
    torch.testing.assert_close(ours.exp().sum(-1), torch.ones(x_t.shape), rtol=0, atol=1e-5)


@pytest.mark.parametrize("t", [0, 1, 7, STEPS - 1])
def test_sampler_step_is_the_normalised_posterior(t):
    log_p0, x_t = inputs(10 + t)
    if t == 0:
        x_t = x_t.clamp_max(CLASSES - 2)
    sampler = samplers.build("vq_diffusion").bind(Chain())
    logits = torch.cat([log_p0, torch.full((*x_t.shape, 1), -70.0)], -1)
    tr = sampler.transition(logits, x_t, (t + 1) / STEPS, t / STEPS)
    assert isinstance(tr, samplers.Categorical) and tr.probs.shape == (*x_t.shape, CLASSES)
    torch.testing.assert_close(tr.probs.sum(-1), torch.ones(x_t.shape), rtol=0, atol=1e-6)
    if t == 0:  # the last step draws the codes from the prediction; never the mask
        expected = log_p0.exp()
        assert float(tr.probs[..., -1].max()) == 0.0
        torch.testing.assert_close(tr.probs[..., :-1], expected, rtol=0, atol=1e-6)
    else:
        theirs = scheduler().q_posterior(log_p0.transpose(1, 2), x_t, t).transpose(1, 2)
        torch.testing.assert_close(tr.probs, torch.softmax(theirs, -1), rtol=0, atol=1e-6)
        torch.testing.assert_close(tr.probs, theirs.exp(), rtol=0, atol=1e-5)
    x_next = tr.sample(torch.Generator().manual_seed(t))
    lp = tr.probs.gather(-1, x_next[..., None]).squeeze(-1).log().mean(1)
    torch.testing.assert_close(tr.log_prob(x_next), lp)
    assert bool(torch.isfinite(tr.log_prob(x_next)).all())


def test_rows_at_different_timesteps_step_alone():
    log_p0, x_t = inputs(3, batch=2)
    sampler = samplers.build("vq_diffusion").bind(Chain())
    logits = torch.cat([log_p0, torch.zeros(*x_t.shape, 1)], -1)
    both = sampler.transition(logits, x_t, torch.tensor([5, 9]) / STEPS,
                              torch.tensor([4, 8]) / STEPS).probs
    for row, t in [(0, 4), (1, 8)]:
        alone = sampler.transition(logits[row:row + 1], x_t[row:row + 1], (t + 1) / STEPS,
                                   t / STEPS).probs
        torch.testing.assert_close(both[row:row + 1], alone, rtol=0, atol=0)


def test_gumbel_draw_is_the_schedulers_draw():
    log_p0, x_t = inputs(4)
    ours = log_posterior(log_p0, x_t, 6, MaskReplaceSchedule.linear(CLASSES, STEPS))
    drawn = gumbel_draw(ours, torch.Generator().manual_seed(1))
    step = scheduler().step(log_p0.transpose(1, 2), 6, x_t,
                            generator=torch.Generator().manual_seed(1))
    assert torch.equal(drawn, step.prev_sample)


def test_a_step_off_the_chain_and_an_unbound_sampler_are_refused():
    log_p0, x_t = inputs()
    logits = torch.cat([log_p0, torch.zeros(*x_t.shape, 1)], -1)
    with pytest.raises(ValueError, match="not bound"):
        samplers.build("vq_diffusion").transition(logits, x_t, 0.5, 0.45)
    sampler = samplers.build("vq_diffusion").bind(Chain())
    with pytest.raises(ValueError, match="one timestep"):
        sampler.transition(logits, x_t, 10 / STEPS, 8 / STEPS)
    with pytest.raises(ValueError, match="mask-and-replace"):
        samplers.build("vq_diffusion").bind(type("Other", (), {"state_space": samplers.TOKENS})())
