"""udm_grpo on a tiny token model through the unchanged trainer: the states are rebuilt from the
final tokens (by the forward process, MaskGRPO's remasking or one-shot masking), each sample's
from its own stream; the log-probability is that of the final tokens over the scored ones; the
ratio is 1 before the first update for every option; one update moves the policy the
advantages' way."""

from __future__ import annotations

import pytest
import torch

from flowgrpo import seeding
from flowgrpo.training.trainer import Trainer, canonical_advantages
from helpers.tiny_discrete import tiny_discrete_trainer
from helpers.toy import assert_ratio_one


def trainer(tmp_path, path="uniform", steps=6, **train) -> Trainer:
    return tiny_discrete_trainer(tmp_path, "udm_grpo", path, steps, **train)


def prepared(t):
    batch = t.sample(0)
    adv, _ = t.advantages(batch)
    batch.advantages = canonical_advantages(adv, batch)
    return batch, t.objective.prepare(batch)


@pytest.mark.parametrize("path,params", [
    ("uniform", {}), ("masked", {}), ("metric", {}), ("masked", {"states": "remask"}),
    ("masked", {"states": "one_shot"}), ("uniform", {"guidance": 1.0, "num_states": 2}),
])
def test_the_ratio_is_one_before_the_first_update(tmp_path, path, params):
    t = trainer(tmp_path, path, objective_params=params, beta=0.05)
    assert not t.objective.needs_transitions
    assert_ratio_one(t)


def test_forward_states_come_from_the_final_tokens_at_consecutive_grid_levels(tmp_path):
    t = trainer(tmp_path, "masked", objective_params={"num_states": 3, "start": [1, 3]})
    batch, state = prepared(t)
    x1, grid = batch.traj.final.long(), batch.traj.sigmas.reshape(-1)
    mask = t.adapter.path.mask_id
    for row in range(len(x1)):
        # three consecutive levels of the rollout's grid, from a start in [1, 3)
        start = int(torch.nonzero(grid == state.sigmas[row, 0])[0])
        assert start in (1, 2)
        assert torch.equal(state.sigmas[row], grid[start:start + 3])
        for k in range(3):
            x = state.states[row, k]
            kept = x != mask
            # the forward process of a masked path: a token is the final one or the mask
            assert torch.equal(x[kept], x1[row][kept])
            assert torch.equal(state.scored[row, k], ~kept)
    # the rollout's own states are not what is trained on
    assert not torch.equal(state.states[:, 0], batch.traj.latents[:, 1].long())


def test_the_log_prob_is_of_the_final_tokens_over_every_token_on_a_uniform_path(tmp_path):
    t = trainer(tmp_path, "uniform")
    batch, state = prepared(t)
    idx = torch.arange(4)
    x1 = batch.traj.final.long()
    with torch.no_grad():
        logits = t.adapter.logits(state.states[:, 1], state.sigmas[:, 1],
                                  batch.traj.cond.index(idx), t.objective.guidance)
        want = logits.float().log_softmax(-1).gather(-1, x1[..., None])[..., 0].mean(1)
        got = t.objective.log_probs(batch, state, idx, 1)[:, 0]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(state.old[:, 1], want)


def test_remask_follows_the_maskgrpo_schedule_and_scores_masked_tokens(tmp_path):
    t = trainer(tmp_path, "masked", objective_params={"states": "remask"})
    ratios = t.objective.remask_ratios()
    assert ratios == pytest.approx([0.7, 0.8, 0.9, 0.999])
    batch, state = prepared(t)
    masked = state.states == t.adapter.path.mask_id
    assert torch.equal(state.scored, masked)
    torch.testing.assert_close(state.sigmas, torch.tensor(ratios).expand(4, 4))
    # 4 samples x 64 tokens per ratio: the masked share rises with k and sits near r_k
    share = masked.float().mean((0, 2))
    assert bool((share[1:] >= share[:-1]).all())
    assert float((share - torch.tensor(ratios)).abs().max()) < 0.1


def test_one_shot_masks_every_token_once(tmp_path):
    t = trainer(tmp_path, "masked", objective_params={"states": "one_shot"})
    batch, state = prepared(t)
    assert state.states.shape[1] == 1 and t.objective.units(batch) == [0]
    assert bool((state.states == t.adapter.path.mask_id).all()) and bool(state.scored.all())
    assert bool((state.sigmas == 1.0).all())


def test_states_belong_to_the_sample_not_to_its_batch_position(tmp_path):
    t = trainer(tmp_path, "uniform")
    batch, state = prepared(t)
    batch.index = batch.index.flip(0)
    batch.traj.latents = batch.traj.latents.flip(0)
    flipped = t.objective.build_states(batch)
    assert torch.equal(flipped.states, state.states.flip(0))
    # and the stream is the declared one
    gen = seeding.generator("forward_states", t.objective.policy.seed, batch.iteration,
                            int(batch.index[0]))
    start = int(torch.randint(0, 3, (1,), generator=gen))
    assert float(flipped.sigmas[0, 0]) == float(batch.traj.sigmas.reshape(-1)[start])


def test_one_update_moves_the_policy_the_advantages_way(tmp_path):
    t = trainer(tmp_path, "uniform", loss="clip", loss_params={"clip_low": 0.9, "clip_high": 10.0})
    batch, _ = prepared(t)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    batch.advantages = canonical_advantages(adv, batch)
    state = t.objective.prepare(batch)
    t.update(batch, batch.advantages, 0)
    with torch.no_grad():
        moved = t.objective.log_probs(batch, state, torch.arange(4)).sum(1) - state.old.sum(1)
    assert float(moved[adv > 0].mean()) > float(moved[adv < 0].mean())


@pytest.mark.parametrize("path,params,message", [
    ("uniform", {"states": "remask"}, "needs a masked path"),
    ("masked", {"states": "one_shot", "num_states": 2}, "one state"),
    ("masked", {"start": [3, 1]}, "0 <= lo < hi"),
    ("masked", {"start": 2}, "two integers"),
    ("masked", {"mask_ratio": 1.0}, r"\[0, 1\)"),
    ("masked", {"states": "backward"}, "states"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, path, params, message):
    with pytest.raises(ValueError, match=message):
        trainer(tmp_path, path, objective_params=params)


def test_a_start_past_the_rollout_grid_is_refused(tmp_path):
    t = trainer(tmp_path, "masked", steps=3, objective_params={"start": [0, 3]})
    with pytest.raises(ValueError, match="runs past the rollout's 3 steps"):
        prepared(t)
