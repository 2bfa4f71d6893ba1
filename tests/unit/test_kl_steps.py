"""``kl_steps: n`` of the ratio objective: the KL term from n of the J trained steps, each
scaled by J / n, an unbiased estimate of the every-step term at n / J of the reference calls."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.training.trainer import canonical_advantages
from helpers.toy import assert_ratio_one, toy_trainer


def per_unit_kl(t, batch, state):
    idx = torch.arange(len(batch.groups))
    return {unit[1]: float(t.objective.loss(batch, state, idx, unit)[1].get("train/kl", 0.0))
            for unit in t.objective.units(batch)}


def prepared(t):
    batch = t.sample(0)
    batch.advantages = canonical_advantages(t.advantages(batch)[0], batch)
    return batch, t.objective.prepare(batch)


def test_kl_from_a_subset_of_steps_is_the_scaled_subset_of_the_every_step_kl(tmp_path):
    full = toy_trainer(tmp_path / "f", "train.beta=0.1")
    part = toy_trainer(tmp_path / "p", "train.beta=0.1", "train.objective_params={kl_steps: 3}")
    with torch.no_grad():  # move both policies off the reference, alike, so the KL is not 0
        for t in (full, part):
            for name, p in t.adapter.transformer.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    batch, state = prepared(full)
    kl_full = per_unit_kl(full, batch, state)
    num = batch.traj.num_trained
    batch_p, state_p = prepared(part)
    chosen = part.objective.kl_at
    assert len(chosen) == 3 and chosen <= set(range(num))
    part.calls.take()
    kl_part = per_unit_kl(part, batch_p, state_p)
    # the reference is called at the drawn steps only: one no-grad row per sample and step
    assert part.calls.take()["calls/nograd"] == 3 * len(batch.groups)
    assert all(kl_part[j] == 0.0 for j in range(num) if j not in chosen)
    for j in chosen:
        assert kl_part[j] == pytest.approx(kl_full[j] * num / 3, rel=1e-5)
    assert sum(kl_full.values()) > 0
    # averaged over the units, the estimate is the mean KL of the drawn steps; the draw is
    # uniform over subsets, so its expectation is the every-step mean
    assert sum(kl_part.values()) / num == pytest.approx(
        sum(kl_full[j] for j in chosen) / 3, rel=1e-5)


def test_kl_steps_are_drawn_per_iteration_from_the_run_seed(tmp_path):
    t = toy_trainer(tmp_path, "train.beta=0.1", "train.objective_params={kl_steps: 2}")
    batch, _ = prepared(t)
    seen = []
    for iteration in range(6):
        batch.iteration = iteration
        t.objective.prepare(batch)
        seen.append(frozenset(t.objective.kl_at))
        t.objective.prepare(batch)
        assert t.objective.kl_at == seen[-1]  # the same draw for the same iteration
    assert len(set(seen)) > 1
    assert_ratio_one(t)


def test_kl_steps_needs_single_step_calls(tmp_path):
    from flowgrpo.rl.objectives import OBJECTIVES

    t = toy_trainer(tmp_path, "train.beta=0.1")
    with pytest.raises(ValueError, match="steps_per_call: 1"):
        OBJECTIVES.build("ratio", t.objective.policy, kl_steps=2, steps_per_call=3)
    with pytest.raises(ValueError, match="kl_steps"):
        OBJECTIVES.build("ratio", t.objective.policy, kl_steps=-1)
