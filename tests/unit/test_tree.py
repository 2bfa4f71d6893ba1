"""BranchGRPO's tree rollout and tree credit (flowgrpo.rl.tree): every leaf is a chain rollout
given its nodes' noise, shared prefixes take fewer model rows, and per-node advantages and edge
weights follow the authors' rule on a hand-computed 4-leaf tree."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import samplers
from flowgrpo.rl import advantages as adv_lib
from flowgrpo.rl import rollout as rollout_lib
from flowgrpo.rl import tree as tree_lib
from flowgrpo.rl.credit import CREDITS
from flowgrpo.rl.rollout import ROLLOUTS, RolloutSpec, Trajectory, rollout
from flowgrpo.training.calls import CallCounter
from pipelines import Cond


class Net(torch.nn.Module):
    """A small nonlinear velocity field of the latent, the noise level and the prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 6).reshape(1, 6))

    def forward(self, hidden_states, sigma, prompt):
        return torch.tanh(hidden_states * self.w + prompt) * (1 + sigma[:, None])


class Adapter:
    state_space = samplers.CONTINUOUS

    def __init__(self) -> None:
        self.transformer = Net()

    def velocity(self, x, sigma, cond, guidance):
        return self.transformer(hidden_states=x, sigma=sigma, prompt=cond.tensors["prompt"])


BRANCH_AT, FACTOR, STEPS = [1, 3], 2, 6
SIGMAS = torch.linspace(0.9, 0.0, STEPS + 1)


def setup(groups: list[int]):
    adapter = Adapter()
    spec = RolloutSpec(samplers.build("sde", noise_level=0.7))
    b = len(groups)
    cond = Cond({"prompt": torch.tensor(groups, dtype=torch.float32)[:, None].repeat(1, 6) / 3})
    noise = torch.randn(b, 6, generator=torch.Generator().manual_seed(1))
    trained = torch.arange(STEPS - 1).repeat(b, 1)  # the last step (to 0) is Euler
    return adapter, spec, cond, noise, trained, torch.tensor(groups)


class Tag:
    """A noise stream for a patched ``step_noise``: the next entry at each draw."""

    def __init__(self, seq):
        self.seq, self.pos = seq, 0


def table_noise(x, stochastic, generator, space=None):
    noise = torch.zeros(x.shape)
    for i in stochastic.nonzero().flatten().tolist():
        noise[i] = generator[i].seq[generator[i].pos]
        generator[i].pos += 1
    return noise


def test_the_registry_builds_chain_as_the_rollout_function_and_tree_with_its_params():
    assert rollout_lib.build("chain") is rollout
    piece = ROLLOUTS.build("tree", branch_at=[3, 1], factor=2)
    assert piece.branch_at == [1, 3] and piece.leaves == 4 and piece.groupwise


def test_each_leaf_is_a_chain_rollout_given_its_nodes_noise(monkeypatch):
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    adapter, spec, cond, noise, trained, g = setup(groups)
    scale = 0.5
    tree = ROLLOUTS.build("tree", branch_at=BRANCH_AT, factor=FACTOR, noise_scale=scale)
    table = torch.randn(len(groups), STEPS - 1, 6, generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(tree_lib, "step_noise", table_noise)
    monkeypatch.setattr(rollout_lib, "step_noise", table_noise)
    counter = CallCounter([adapter.transformer])
    traj = tree(adapter, spec, cond, noise, SIGMAS, trained,
                generator=[Tag(table[i]) for i in range(len(groups))], groups=g)
    tree_rows = counter.take()["calls/nograd"]
    for leaf in range(len(groups)):
        first, p = leaf // 4 * 4, leaf % 4
        seq = []
        for k in range(STEPS - 1):  # the noise of the leaf's node: its first leaf's stream
            done = sum(b <= k for b in BRANCH_AT)
            block = 4 // FACTOR**done
            rep = first + p // block * block
            seq.append(table[rep, k] * (scale if k in BRANCH_AT else 1.0))
        chain = rollout(adapter, spec, cond.index([leaf]), noise[[first]], SIGMAS,
                        trained[[leaf]], generator=[Tag(seq)])
        torch.testing.assert_close(traj.latents[leaf], chain.latents[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(traj.log_probs[leaf], chain.log_probs[0], rtol=0, atol=1e-5)
    chain_rows = counter.take()["calls/nograd"]
    assert chain_rows == len(groups) * STEPS
    # per tree: 1 node for step 0 and 1, 2 for steps 2 and 3, 4 for steps 4 and 5
    assert tree_rows == 2 * (1 + 1 + 2 + 2 + 4 + 4) < chain_rows
    assert torch.equal(traj.trained, trained)


def test_a_groups_first_leaf_is_exactly_its_chain_rollout_with_real_generators():
    groups = [0, 0, 0, 0]
    adapter, spec, cond, noise, trained, g = setup(groups)
    tree = ROLLOUTS.build("tree", branch_at=BRANCH_AT, factor=FACTOR)
    gens = [torch.Generator().manual_seed(10 + i) for i in range(4)]
    traj = tree(adapter, spec, cond, noise, SIGMAS, trained, generator=gens, groups=g)
    chain = rollout(adapter, spec, cond.index([0]), noise[[0]], SIGMAS, trained[[0]],
                    generator=[torch.Generator().manual_seed(10)])
    torch.testing.assert_close(traj.latents[0], chain.latents[0], rtol=0, atol=1e-6)
    # leaves share the states before the first branch and differ after it
    assert torch.equal(traj.latents[0, :2], traj.latents[3, :2])
    assert not torch.equal(traj.latents[0, 2], traj.latents[3, 2])
    assert torch.equal(traj.latents[0, 3], traj.latents[1, 3])


def test_a_group_size_that_is_not_a_power_of_the_factor_is_a_one_line_error():
    adapter, spec, cond, noise, trained, g = setup([0, 0, 0])
    tree = ROLLOUTS.build("tree", branch_at=BRANCH_AT, factor=FACTOR)
    with pytest.raises(ValueError, match=r"train.group_size 3 must equal factor \*\* "
                                         r"len\(branch_at\) = 2 \*\* 2 = 4") as err:
        tree(adapter, spec, cond, noise, SIGMAS, trained, groups=g)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not trained steps"):
        tree(adapter, spec, cond, noise[:1].repeat(4, 1), SIGMAS,
             torch.tensor([[0, 2, 4]]).repeat(4, 1), groups=torch.zeros(4, dtype=torch.long))


def four_leaf_batch(rewards, steps=5):
    """A hand-made 4-leaf tree branching (factor 2) at steps 1 and 3: the state after step k of
    each leaf is its node's."""
    base = torch.randn(4, steps + 1, 3, generator=torch.Generator().manual_seed(0))
    latents = torch.empty(4, steps + 1, 3)
    for leaf in range(4):
        for t in range(steps + 1):
            done = sum(b < t for b in BRANCH_AT)  # branches taken before state t
            block = 4 // 2**done
            latents[leaf, t] = base[leaf // block * block, t]
    trained = torch.arange(steps).repeat(4, 1)
    traj = Trajectory(latents, torch.linspace(1, 0, steps + 1), trained, torch.zeros(4, steps),
                      Cond({"prompt": torch.zeros(4, 1)}))
    return SimpleNamespace(traj=traj, groups=torch.zeros(4, dtype=torch.long),
                           reward=SimpleNamespace(scores=torch.tensor(rewards)),
                           step_weights=torch.ones(4, steps), iteration=0, info={})


def test_per_node_advantages_and_edge_weights_of_a_four_leaf_tree_by_hand():
    r = [1.0, 2.0, 4.0, 8.0]
    batch = four_leaf_batch(r)
    signal = CREDITS.build("tree").rewards(None, None, batch)
    assert signal.scores.shape == (4, 1, 5, 1)
    node = signal.scores[:, 0, :, 0]
    torch.testing.assert_close(node[:, 0], torch.full((4,), 3.75))  # the root's child
    for k in (1, 2):  # two nodes: leaves {0, 1} and {2, 3}
        torch.testing.assert_close(node[:, k], torch.tensor([1.5, 1.5, 6.0, 6.0]))
    for k in (3, 4):  # the leaves themselves
        torch.testing.assert_close(node[:, k], torch.tensor(r))
    adv, _ = adv_lib.compute_advantages(signal.scores, batch.groups, adv_clip=None)
    adv = adv[:, 0, :, 0]
    assert torch.equal(adv[:, 0], torch.zeros(4))  # one node at that depth: 0
    for k in (1, 2):  # mean 3.75, population std 2.25
        torch.testing.assert_close(adv[:, k], torch.tensor([-1.0, -1, 1, 1]), atol=1e-4,
                                   rtol=0)
        # the authors' unbiased std over the 2 nodes: theirs = ours * sqrt((n - 1) / n)
        authors = (torch.tensor([1.5, 6.0]) - 3.75) / torch.tensor([1.5, 6.0]).std()
        torch.testing.assert_close(adv[[0, 2], k] * math.sqrt(1 / 2), authors, atol=1e-4,
                                   rtol=0)
    std = math.sqrt(sum((x - 3.75) ** 2 for x in r) / 4)
    for k in (3, 4):
        want = torch.tensor([(x - 3.75) / std for x in r])
        torch.testing.assert_close(adv[:, k], want, atol=1e-4, rtol=0)
    # every edge once: 1/4 for the root's step, 1/2 on the two-leaf nodes, scaled to mean 1
    share = torch.tensor([1 / 4, 1 / 2, 1 / 2, 1, 1]).repeat(4, 1)
    torch.testing.assert_close(batch.step_weights, share * 20 / 13)
    edges = [len(batch.traj.latents[:, k + 1].unique(dim=0)) for k in range(5)]
    assert edges == [1, 2, 2, 4, 4]
    for k in range(5):  # each step's total weight is its number of edges (times the scale)
        assert abs(float(batch.step_weights[:, k].sum()) - edges[k] * 20 / 13) < 1e-5


def test_depth_pruning_drops_trained_steps_and_width_pruning_keeps_the_best_and_worst():
    batch = four_leaf_batch([1.0, 2.0, 4.0, 8.0])
    signal = CREDITS.build("tree", prune_steps=[0, 2]).rewards(None, None, batch)
    assert batch.traj.trained[0].tolist() == [1, 3, 4] and signal.scores.shape == (4, 1, 3, 1)
    assert batch.step_weights.shape == (4, 3)
    # sliding: one step earlier every 2 iterations, never before step 3
    assert tree_lib.pruned_steps([4], 2, 3, iteration=5) == [3]
    assert tree_lib.pruned_steps([4], 2, 3, iteration=1) == [4]
    batch = four_leaf_batch([1.0, 2.0, 4.0, 8.0])
    CREDITS.build("tree", width=2, width_ratio=0.5).rewards(None, None, batch)
    # after the last branch (step 3) only step 4 is a candidate: 4 leaves, keep 2, the best
    # (leaf 3) and the worst (leaf 0)
    assert (batch.step_weights[:, 4] > 0).tolist() == [True, False, False, True]
    assert (batch.step_weights[:, :4] > 0).all()
    batch = four_leaf_batch([1.0, 2.0, 4.0, 8.0], steps=6)
    CREDITS.build("tree", width=1, width_ratio=0.5).rewards(None, None, batch)
    # mode 1: each leaf keeps the better one of its two steps after the last branch (a tie:
    # the earlier)
    assert (batch.step_weights[:, 4:] > 0).tolist() == [[True, False]] * 4
    with pytest.raises(ValueError, match="width"):
        CREDITS.build("tree", width=3)
