"""DGPO, Diffusion-DPO and SFT: each objective's defining property, on small tensors and on the
toy before its first update (the policy equals the reference: margin 0)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from flowgrpo.rl.objectives import OBJECTIVES
from flowgrpo.rl.objectives.preference import dpo_loss, group_extremes
from flowgrpo.training.trainer import canonical_advantages
from helpers.toy import lora, toy_trainer

ODE = ["sampler.name=ode", "sampler.params={}", "train.beta=0"]


def prepared(t):
    batch = t.sample(0)
    batch.advantages = canonical_advantages(t.advantages(batch)[0], batch)
    return batch, t.objective.prepare(batch)


def grads(t) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in t.params]
    for p in t.params:
        p.grad = None
    return out


def close(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)


def test_dpo_loss_at_the_reference_is_log2_with_the_closed_form_gradient():
    e_w = torch.tensor([0.3, 1.2, 0.7], requires_grad=True)
    e_l = torch.tensor([0.9, 0.4, 0.7], requires_grad=True)
    beta = 50.0
    loss, inside = dpo_loss(e_w, e_l, e_w.detach(), e_l.detach(), beta)
    assert float(loss) == pytest.approx(math.log(2))
    assert torch.equal(inside, torch.zeros(3))
    loss.backward()
    n = 3  # d/de_w of -log sigmoid(-beta/2 (e_w - e_l)) at 0 is beta/4, over a mean of n
    torch.testing.assert_close(e_w.grad, torch.full((3,), beta / 4 / n))
    torch.testing.assert_close(e_l.grad, torch.full((3,), -beta / 4 / n))
    # away from the reference a winner fitted better than the reference lowers the loss
    better, _ = dpo_loss(e_w.detach() - 0.01, e_l.detach(), e_w.detach(), e_l.detach(), beta)
    assert float(better) < math.log(2)


def test_dgpo_group_weights_are_the_sigmoid_of_the_groups_weighted_margins(tmp_path):
    t = toy_trainer(tmp_path, *ODE, "train.objective=dgpo",
                    "train.objective_params={beta_dpo: 10.0}")
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    delta = torch.tensor([0.1, 0.3, -0.2, 0.0, 0.05, 0.05])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    w = t.objective.group_weights(adv, delta, groups, 3)
    g0 = torch.sigmoid(torch.tensor(10.0 * (0.1 - 0.3 - 0.1) / 3))
    g1 = torch.sigmoid(torch.tensor(10.0 * (0.0 + 0.1 - 0.1) / 3))
    torch.testing.assert_close(w, torch.stack([g0] * 3 + [g1] * 3))
    # at the reference every delta is 0: every weight is 1/2
    assert torch.equal(t.objective.group_weights(adv, torch.zeros(6), groups, 3),
                       torch.full((6,), 0.5))


def test_dgpo_before_the_first_update_is_half_the_advantage_weighted_flow_matching(tmp_path):
    t = toy_trainer(tmp_path, *ODE, "train.objective=dgpo")
    batch, state = prepared(t)
    idx = torch.arange(len(batch.groups))
    loss, metrics = t.objective.loss(batch, state, idx, 0)
    assert float(metrics["train/margin"]) <= 1e-6  # the contract: the policy is the reference
    assert float(metrics["train/group_weight"]) == pytest.approx(0.5)
    loss.backward()
    got = grads(t)
    e, _ = t.objective.errors(batch, state[0], idx, 0)
    adv = batch.advantages[:, 0, 0, 0]
    (0.5 * adv * e).mean().backward()
    close(got, grads(t))
    assert any(g.abs().max() > 0 for g in got)


def test_dpo_online_pairs_are_each_groups_best_and_worst_and_start_at_log2(tmp_path):
    scores = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.2, 0.2, 0.7, 0.3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    best, worst = group_extremes(scores, groups)
    assert best.tolist() == [1, 6] and worst.tolist() == [0, 4]  # ties: the lowest index
    tied = group_extremes(torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert len(tied[0]) == 0  # a group of equal rewards gives no pair

    t = toy_trainer(tmp_path, *ODE, "train.objective=dpo",
                    "train.objective_params={beta_dpo: 100.0}")
    batch, state = prepared(t)
    data, draws, best, worst, _, _ = state
    exp_best, exp_worst = group_extremes(batch.reward.scores, batch.groups)
    assert torch.equal(best, exp_best) and torch.equal(worst, exp_worst) and len(best) > 0
    assert torch.equal(draws.t[worst], draws.t[best])  # a pair shares its draw
    idx = torch.arange(len(batch.groups))
    loss, metrics = t.objective.loss(batch, state, idx, 0)
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6)
    assert float(metrics["train/margin"]) <= 1e-6
    loss.backward()
    got = grads(t)
    e, _ = t.objective.errors(batch, draws, torch.cat([best, worst]), 0)
    ((100.0 / 4) * (e[:len(best)] - e[len(best):]).mean()).backward()
    close(got, grads(t))


def test_dpo_offline_trains_the_preference_files_pairs(tmp_path):
    t0 = toy_trainer(tmp_path / "a", *ODE, "train.objective=elbo")
    final = t0.sample(0).traj.final
    folder = tmp_path / "prefs"
    folder.mkdir()
    save_file({"chosen": final[:4].contiguous(), "rejected": final[4:8].contiguous()},
              str(folder / "pairs.safetensors"))
    (folder / "prompts.json").write_text(json.dumps([f"a handwritten digit {i}"
                                                     for i in range(4)]))
    t = toy_trainer(tmp_path / "b", *ODE, "train.objective=dpo",
                    f"train.objective_params={{pairs: file, preference_file: '{folder}', "
                    f"pairs_per_iteration: 3}}")
    batch, state = prepared(t)
    data = state[0]
    assert len(state[2]) == 3 and data.prompts[:3] == data.prompts[3:]
    chosen = {tuple(final[i].flatten()[:5].tolist()) for i in range(4)}
    assert all(tuple(x.flatten()[:5].tolist()) in chosen for x in data.traj.final[:3])
    before = lora(t)
    row = t.update(batch, batch.advantages[:, 0, 0, 0], 0)
    assert row["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert any((lora(t)[n] - w).abs().max() > 0 for n, w in before.items())


@pytest.mark.parametrize("bad,message", [
    ({"pairs": "file"}, "needs preference_file"),
    ({"pairs": "file", "preference_file": "/nonexistent"}, "needs pairs.safetensors"),
    ({"preference_file": "/x"}, "with pairs: online"),
    ({"pairs": "both"}, "pairs"),
    ({"beta_dpo": 0}, "beta_dpo must be"),
])
def test_bad_dpo_settings_are_one_line_errors(tmp_path, bad, message):
    t = toy_trainer(tmp_path, *ODE, "train.objective=dpo")
    with pytest.raises(ValueError, match=message):
        OBJECTIVES.build("dpo", t.objective.policy, **bad)


def test_sft_trains_the_flow_matching_loss_of_each_groups_best(tmp_path):
    t = toy_trainer(tmp_path, *ODE, "train.objective=sft")
    batch, state = prepared(t)
    draws, keep, _ = state
    best, _ = group_extremes(batch.reward.scores, batch.groups)
    assert keep.nonzero().flatten().tolist() == sorted(best.tolist())
    idx = torch.arange(len(batch.groups))
    loss, _ = t.objective.loss(batch, state, idx, 0)
    loss.backward()
    got = grads(t)
    e, _ = t.objective.errors(batch, draws, keep.nonzero().flatten(), 0)
    (e.sum() / len(idx)).backward()
    close(got, grads(t))
    two = OBJECTIVES.build("sft", t.objective.policy, top_k=2)
    assert int(two.selected(batch).sum()) == 2 * len(best)


def test_only_sft_is_outside_the_ratio_one_contract():
    """The contract tests (tests/e2e/test_core.py) run every anchored objective; SFT compares the
    policy with nothing, so it alone is left out, and the preference ones are in."""
    unanchored = {n for n in OBJECTIVES.names() if not OBJECTIVES.get(n).anchored}
    assert unanchored == {"sft"}
    assert {"dgpo", "dpo"} <= {n for n in OBJECTIVES.names() if OBJECTIVES.get(n).anchored}
