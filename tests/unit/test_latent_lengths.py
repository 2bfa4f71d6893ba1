"""Batches of samples of their own lengths (``LATENT_LENGTH``): the generic pieces the speech
families' per-prompt durations rest on, checked against each sample drawn or reduced alone."""

from __future__ import annotations

import pytest
import torch

import samplers
from flowgrpo.rl.objectives.likelihood_free import draw, weighted_lp
from flowgrpo.rl.rollout import step_noise
from pipelines import Cond, FlowAdapter
from pipelines.lengths import (
    decode_by_length,
    latent_lengths,
    length_condition,
    length_weight,
    pad_frames,
)

LENGTHS = [3, 7]
TOTAL = 7
D = 5  # 3 * 5 and 7 * 5 are not multiples of 16: a longer draw is not the shorter one's prefix


def gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_step_noise_of_each_sample_is_its_draw_at_its_own_length():
    x = torch.zeros(2, TOTAL, D)
    noise = step_noise(x, torch.tensor([True, True]), gens(0, 1), lengths=torch.tensor(LENGTHS))
    for i, (n, g) in enumerate(zip(LENGTHS, gens(0, 1))):
        assert torch.equal(noise[i, :n], torch.randn(n, D, generator=g))
        assert noise[i, n:].eq(0).all()
    # a prefix of the padded draw is not the short draw: drawing at the length matters here
    assert not torch.equal(torch.randn(TOTAL, D, generator=gens(0)[0])[:3],
                           torch.randn(3, D, generator=gens(0)[0]))
    skipped = step_noise(x, torch.tensor([False, True]), gens(0, 1),
                         lengths=torch.tensor(LENGTHS))
    assert skipped[0].eq(0).all() and torch.equal(skipped[1], noise[1])
    one = step_noise(x, torch.tensor([True, True]), gens(5)[0], lengths=torch.tensor(LENGTHS))
    assert one[0, 3:].eq(0).all() and one[0, :3].ne(0).all()
    # without lengths, unchanged
    assert torch.equal(step_noise(x, torch.tensor([True, True]), gens(0, 1)),
                       torch.stack([torch.randn(TOTAL, D, generator=g) for g in gens(0, 1)]))


class Plain(FlowAdapter):
    """The default hooks only."""

    transformer = torch.nn.Linear(1, 1)

    def encode(self, prompts):
        return Cond({"x": torch.zeros(len(prompts), 1)})

    def noise(self, n, generator=None):
        return torch.randn(n, 4, 6, generator=generator)

    def schedule(self, num_steps):
        return torch.linspace(1, 0, num_steps + 1)

    def velocity(self, x, sigma, cond, guidance):
        return x

    def decode(self, x):
        return x


def test_default_initial_noise_is_each_samples_noise_and_reads_no_condition():
    adapter = Plain()
    out = adapter.initial_noise(gens(3, 4), adapter.encode(["a", "b"]))
    assert torch.equal(out, torch.cat([adapter.noise(1, g) for g in gens(3, 4)]))


def test_length_weight_makes_the_padded_mean_the_mean_over_own_frames():
    cond = length_condition(LENGTHS, start=1, device=torch.device("cpu"))
    weight = cond["logprob_weight"]
    assert weight.shape == (2, TOTAL, 1) and cond["latent_length"].tolist() == LENGTHS
    assert weight[1, 1:].eq(1).all() and weight[:, 0].eq(0).all() and weight[0, 3:].eq(0).all()
    values = torch.randn(2, TOTAL, D)
    padded = (values * weight).flatten(1).mean(1)
    own = torch.stack([values[i, 1:n].flatten().sum() / (n * D) for i, n in enumerate(LENGTHS)])
    torch.testing.assert_close(padded, own, rtol=1e-6, atol=1e-6)
    assert torch.equal(length_weight(torch.tensor([4, 4]), 4), torch.ones(2, 4, 1))


def test_pad_frames_and_latent_lengths_round_trip():
    parts = [torch.randn(1, n, D) + 3 for n in LENGTHS]
    x = pad_frames(parts, TOTAL)
    assert x.shape == (2, TOTAL, D) and torch.equal(x[0, :3], parts[0][0]) and x[0, 3:].eq(0).all()
    assert latent_lengths(x).tolist() == LENGTHS
    assert latent_lengths(torch.zeros(1, 4, D)).tolist() == [1]


def test_decode_by_length_decodes_each_sample_alone():
    x = pad_frames([torch.randn(1, n, D) + 3 for n in LENGTHS], TOTAL)

    def decode(z):  # a convolution over frames: the padding would reach the last frames
        audio = torch.nn.functional.conv1d(z.transpose(1, 2), torch.ones(1, D, 3), padding=1)
        return audio.repeat_interleave(2, dim=-1)

    audio = decode_by_length(x, decode)
    assert audio.shape == (2, 1, 2 * TOTAL)
    for i, n in enumerate(LENGTHS):
        torch.testing.assert_close(audio[i, :, :2 * n], decode(x[i:i + 1, :n])[0])
        assert audio[i, :, 2 * n:].eq(0).all()
    assert torch.equal(decode_by_length(x[1:], decode), decode(x[1:]))


def test_forward_draws_and_their_weighted_errors_are_each_samples_alone():
    x0 = pad_frames([torch.randn(1, n, D) + 1 for n in LENGTHS], TOTAL)
    lengths = torch.tensor(LENGTHS)
    mixed = draw(x0, 3, "logit_normal", gens(0, 1), lengths=lengths)
    assert mixed.noise.shape == (2, 3, TOTAL, D)
    weight = length_condition(LENGTHS, 0, torch.device("cpu"))["logprob_weight"]
    err = torch.randn(2, TOTAL, D) * (torch.arange(TOTAL)[None, :, None] < lengths[:, None, None])
    t = torch.tensor([0.3, 0.8])
    for i, n in enumerate(LENGTHS):
        alone = draw(x0[i:i + 1, :n], 3, "logit_normal", gens(i))
        assert torch.equal(mixed.t[i], alone.t[0])
        assert torch.equal(mixed.noise[i, :, :n], alone.noise[0])
        assert mixed.noise[i, :, n:].eq(0).all()
        for weighting in ("uniform", "x0", "adaptive", "ghuber"):
            padded = weighted_lp(err[i:i + 1], t[i:i + 1], weighting, weight=weight[i:i + 1])
            own = weighted_lp(err[i:i + 1, :n], t[i:i + 1], weighting)
            torch.testing.assert_close(padded, own, rtol=1e-5, atol=1e-6)
    binary = (weight > 0).float()  # a 0/1 weight on errors already 0 there: the plain mean
    for weighting in ("uniform", "adaptive"):
        assert torch.equal(weighted_lp(err, t, weighting, weight=binary),
                           weighted_lp(err, t, weighting))


@pytest.mark.parametrize("name", ["sde", "cps", "langevin"])
def test_zero_padding_stays_zero_under_every_stochastic_step(name):
    """``x = 0`` with ``v = 0`` and zero noise steps to exactly 0: the padding's invariant."""
    sampler = samplers.get(name)
    x = torch.zeros(1, 4, D)
    tr = sampler.transition(torch.zeros_like(x), x, 0.6, 0.4,
                            velocity_fn=lambda y, s: torch.zeros_like(y))
    assert tr.sample(noise=torch.zeros_like(x)).eq(0).all()
