"""The discrete steps (samplers/discrete.py) against direct enumeration on small vocabularies, their
sampled frequencies against their probabilities, and dFlowGRPO's Monte-Carlo estimate against the
exact metric step."""

from __future__ import annotations

import math

import pytest
import torch

from samplers import discrete

V, MASK = 5, 4  # with a masked source the last id is the mask


def _logits(b=2, length=3, v=V, seed=0):
    return torch.randn(b, length, v, generator=torch.Generator().manual_seed(seed)) * 2


def _distance(v=V):
    i = torch.arange(v, dtype=torch.float32)
    return (i[:, None] - i[None, :]).abs()  # intensity distance


def _enumerate_mixture(logits, x_t, kt, kn, mask_id):
    """The step's probabilities by the defining rules, one token and one value at a time."""
    a = (kn - kt) / (1 - kt)
    b, length, v = logits.shape
    out = torch.zeros(b, length, v)
    for i in range(b):
        for n in range(length):
            p = [math.exp(float(z)) for z in logits[i, n]]
            here = int(x_t[i, n])
            if mask_id is not None:
                p[mask_id] = 0.0
            s = sum(p)
            p = [q / s for q in p]
            for y in range(v):
                if mask_id is not None and here != mask_id:  # unmasked: it stays
                    out[i, n, y] = float(y == here)
                else:
                    out[i, n, y] = a * p[y] + (1 - a) * float(y == here)
    return out


@pytest.mark.parametrize("mask_id", [MASK, None], ids=["masked", "uniform"])
def test_mixture_step_equals_enumeration_and_sums_to_one(mask_id):
    logits = _logits()
    x_t = torch.tensor([[MASK, 1, MASK], [0, MASK, 3]])
    step = discrete.mixture_step(logits, x_t, 0.3, 0.55, mask_id)
    expected = _enumerate_mixture(logits, x_t, 0.3, 0.55, mask_id)
    torch.testing.assert_close(step.probs, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step.probs.sum(-1), torch.ones(2, 3))
    if mask_id is not None:  # a masked token unmasks with probability a
        a = (0.55 - 0.3) / 0.7
        assert abs(float(1 - step.probs[0, 0, MASK]) - a) < 1e-6


def _enumerate_metric(logits, x_t, distance, t, h, c=3.0, a=0.9):
    beta = c * (t / (1 - t)) ** a
    dbeta = beta * a / (t * (1 - t))
    b, length, v = logits.shape
    out = torch.zeros(b, length, v)
    for i in range(b):
        for n in range(length):
            post = torch.softmax(logits[i, n], 0)
            here = int(x_t[i, n])
            for x1 in range(v):
                weights = [math.exp(-beta * float(distance[x1, y])) for y in range(v)]
                z = sum(weights)
                rates = [0.0 if y == here else weights[y] / z * dbeta
                         * max(float(distance[here, x1] - distance[x1, y]), 0.0) for y in range(v)]
                lam = sum(rates)
                for y in range(v):
                    if y == here:
                        k = math.exp(-h * lam)
                    else:
                        k = rates[y] / lam * (1 - math.exp(-h * lam)) if lam > 0 else 0.0
                    out[i, n, y] += float(post[x1]) * k
    return out


def test_metric_step_equals_enumeration_and_sums_to_one():
    logits, d = _logits(), _distance()
    x_t = torch.tensor([[0, 2, 4], [1, 1, 3]])
    step = discrete.metric_step(logits, x_t, d, t=0.4, h=0.125)
    torch.testing.assert_close(step.probs, _enumerate_metric(logits, x_t, d, 0.4, 0.125),
                               atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step.probs.sum(-1), torch.ones(2, 3))


def test_metric_rates_only_move_closer_to_the_clean_token():
    d = _distance()
    rates = discrete.metric_rates(torch.tensor([0, 3]), torch.tensor([3, 3]), d, 2.0, 1.5)
    closer = d[3] < d[0, 3]  # tokens nearer x1 = 3 than x_t = 0 is: 1, 2, 3 and 4
    assert torch.equal(rates[0] > 0, closer), rates[0]
    assert float(rates[1].abs().sum()) == 0.0  # at x1 the chain stays


def _chi_square_critical(df: int, z: float = 3.29) -> float:
    """The upper 0.05 % point of chi-square(df) by Wilson-Hilferty."""
    k = 2.0 / (9.0 * df)
    return df * (1 - k + z * math.sqrt(k)) ** 3


@pytest.mark.parametrize("kind", ["masked", "uniform", "metric"])
def test_sampled_frequencies_match_the_probabilities(kind):
    logits = _logits(1, 1, seed=3)
    x_t = torch.tensor([[MASK if kind == "masked" else 2]])
    if kind == "metric":
        step = discrete.metric_step(logits, x_t, _distance(), t=0.5, h=0.25)
    else:
        step = discrete.mixture_step(logits, x_t, 0.2, 0.6, MASK if kind == "masked" else None)
    n = 20000
    many = discrete.Categorical(step.probs.expand(n, 1, V).contiguous())
    draws = many.sample(torch.Generator().manual_seed(0)).flatten()
    counts = torch.bincount(draws, minlength=V).float()
    expected = step.probs[0, 0] * n
    seen = expected > 0
    assert int(counts[~seen].sum()) == 0  # nothing drawn where the probability is 0
    chi2 = float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())
    assert chi2 < _chi_square_critical(int(seen.sum()) - 1), (chi2, counts, expected)


def test_log_prob_and_kl_are_the_categorical_ones():
    logits = _logits()
    x_t = torch.tensor([[MASK, MASK, 1], [MASK, 0, MASK]])
    p = discrete.mixture_step(logits, x_t, 0.1, 0.5, MASK)
    q = discrete.mixture_step(logits * 0.5, x_t, 0.1, 0.5, MASK)
    x_next = torch.tensor([[2, MASK, 1], [3, 0, MASK]])
    direct = torch.stack([torch.stack([p.probs[i, n, x_next[i, n]].log() for n in range(3)]).mean()
                          for i in range(2)])
    torch.testing.assert_close(p.log_prob(x_next), direct)
    assert torch.equal(p.kl(p), torch.zeros(2))
    kl = (p.probs * (p.probs.clamp_min(1e-30).log() - q.probs.clamp_min(1e-30).log())).sum(-1)
    torch.testing.assert_close(p.kl(q), kl.mean(1))
    assert bool((p.kl(q) > 0).all())


def test_monte_carlo_metric_estimate_converges_to_the_exact_step():
    logits, old, d = _logits(1, 4, seed=5), _logits(1, 4, seed=6), _distance()
    x_t = torch.tensor([[0, 1, 2, 4]])
    exact = discrete.metric_step(logits, x_t, d, t=0.45, h=0.2)
    x_next = exact.sample(torch.Generator().manual_seed(1))
    truth = exact.token_log_probs(x_next).exp()
    errors = []
    for n_mc in (4, 64, 1024, 16384):  # the mean error over 8 seeds falls about 4x per step
        errs = []
        for seed in range(8):
            gen = torch.Generator().manual_seed(seed)
            est = discrete.metric_step_log_prob_mc(logits, old, x_t, x_next, d, 0.45, 0.2, n_mc,
                                                   gen)
            errs.append(float((est.exp() - truth).abs().max()))
        errors.append(sum(errs) / len(errs))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors  # it shrinks with n_mc
    # unbiased with a spread ~ 1 / sqrt(n): 4096x the draws, about 64x smaller (at least 20x)
    assert errors[-1] < errors[0] / 20, errors


def test_monte_carlo_ratio_is_one_when_the_policy_is_the_old_one():
    logits, d = _logits(2, 3, seed=7), _distance()
    x_t = torch.tensor([[0, 1, 2], [3, 4, 0]])
    x_next = discrete.metric_step(logits, x_t, d, 0.3, 0.2).sample(torch.Generator().manual_seed(0))
    new = discrete.metric_step_log_prob_mc(logits, logits, x_t, x_next, d, 0.3, 0.2, 24,
                                           torch.Generator().manual_seed(9))
    old = discrete.metric_step_log_prob_mc(logits.detach(), logits, x_t, x_next, d, 0.3, 0.2, 24,
                                           torch.Generator().manual_seed(9))
    assert torch.equal(new, old)


def test_steps_refuse_schedules_outside_their_domain():
    with pytest.raises(ValueError, match="kappa"):
        discrete.mixture_step(_logits(), torch.zeros(2, 3, dtype=torch.long), 0.6, 0.5)
    with pytest.raises(ValueError, match="0 < t < 1"):
        discrete.metric_beta(1.0)
    with pytest.raises(ValueError, match="n_mc"):
        discrete.metric_step_log_prob_mc(_logits(), _logits(), torch.zeros(2, 3, dtype=torch.long),
                                         torch.zeros(2, 3, dtype=torch.long), _distance(), 0.3,
                                         0.1, 0)
