"""TurningPoint-GRPO credit rule against hand-derived sequences (rules as in the docstring).

Each case lists R_0..R_K; ``d`` are the increments, ``g = sign(R_K - R_0)``, ``s = sign(d) * g``.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.rl.credit import turning_points

F, T = False, True


def _run(rows, **options):
    reward, mask = turning_points(torch.tensor(rows, dtype=torch.float32), **options)
    return reward, mask


def _check(rows, want_reward, want_mask, **options):
    reward, mask = _run(rows, **options)
    assert mask.tolist() == want_mask
    torch.testing.assert_close(reward, torch.tensor(want_reward, dtype=torch.float32))


def test_output_shapes_and_dtypes():
    reward, mask = turning_points(torch.zeros(5, 4, dtype=torch.float64))
    assert reward.shape == (5, 3) and reward.dtype == torch.float32
    assert mask.shape == (5, 3) and mask.dtype == torch.bool


def test_monotone_up_first_step_takes_the_whole_gain():
    # d = [1, 1, 1], g = +; step 0: sign(1) * sign(3 - 1) > 0 -> turning, R_3 - R_0 = 3.
    # No s_k < 0, so no later turning point.
    _check([[0.0, 1.0, 2.0, 3.0]], [[3.0, 1.0, 1.0]], [[T, F, F]])


def test_monotone_down_first_step_takes_the_whole_loss():
    # d = [-1, -1, -1], g = -; step 0: sign(-1) * sign(0 - 2) > 0 -> turning, R_3 - R_0 = -3.
    _check([[3.0, 2.0, 1.0, 0.0]], [[-3.0, -1.0, -1.0]], [[T, F, F]])


def test_one_flip_towards_the_trend_is_a_turning_point():
    # d = [-1, 2, 1], g = +, s = [-, +, +]; step 0: sign(-1) * sign(2 + 1) < 0 -> no.
    # step 1: s_0 < 0, s_1 > 0, consistent sign(2) * sign(2 - 1) > 0 -> turning, R_3 - R_1 = 3.
    _check([[0.0, -1.0, 1.0, 2.0]], [[-1.0, 3.0, 1.0]], [[F, T, F]])


def test_downward_flip_under_a_downward_trend_is_a_turning_point():
    # d = [1, -2, -1], g = -, s = [-, +, +]; step 1: consistent sign(-2) * sign(-2 + 1) > 0,
    # reward R_3 - R_1 = -3. Step 0: sign(1) * sign(-2 - 1) < 0 -> no.
    _check([[0.0, 1.0, -1.0, -2.0]], [[1.0, -3.0, -1.0]], [[F, T, F]])


def test_flip_against_the_trend_is_not_a_turning_point():
    # d = [-1, 2, 2, -1], g = +, s = [-, +, +, -]: step 1 turns (R_4 - R_1 = 3); step 3 flips from
    # agreeing to disagreeing (s_2 > 0, s_3 < 0) and keeps its own d_3 = -1.
    _check([[0.0, -1.0, 1.0, 3.0, 2.0]], [[-1.0, 3.0, 2.0, -1.0]], [[F, T, F, F]])


def test_upward_flip_under_a_downward_trend_is_not_a_turning_point():
    # d = [-1, 1.5, -2.5], g = -, s = [+, -, +]. Step 0: sign(-1) * sign(-2 + 1) > 0 -> turning,
    # R_3 - R_0 = -2. Step 1: s_0 > 0 -> no. Step 2: s_1 < 0, s_2 > 0 but it is the last step,
    # sign(R_3 - R_3) = 0 fails the consistency filter.
    _check([[0.0, -1.0, 0.5, -2.0]], [[-2.0, 1.5, -2.5]], [[T, F, F]])


def test_last_step_flip_counts_only_without_the_consistency_filter():
    rows = [[0.0, -1.0, 0.5, -2.0]]
    # Without the filter: step 0 needs s_0 > 0 (yes, -2 = R_3 - R_0); step 2 turns, R_3 - R_2 = -2.5
    # equals d_2 anyway. Balancing sees two negative keys only, so both stay.
    _check(rows, [[-2.0, 1.5, -2.5]], [[T, F, T]], consistency_filter=False)


def test_consistency_filter_rejects_a_flip_that_is_undone():
    # d = [-1, 3, -1], g = +, s = [-, +, -]. Step 1 flips towards the trend but the reward then
    # falls (sign(3) * sign(1 - 2) < 0) -> filtered. Step 0: sign(-1) * sign(1 + 1) < 0.
    rows = [[0.0, -1.0, 2.0, 1.0]]
    _check(rows, [[-1.0, 3.0, -1.0]], [[F, F, F]])
    # Without the filter step 1 turns (R_3 - R_1 = 2); step 0 needs s_0 > 0 -> no.
    _check(rows, [[-1.0, 2.0, -1.0]], [[F, T, F]], consistency_filter=False)


def test_turning_point_with_zero_long_term_reward_keeps_its_increment():
    # Only reachable without the filter. d = [3, -2, 1, -1], g = +, s = [+, -, +, -]: step 0
    # (s_0 > 0) gets R_4 - R_0 = 1; step 2 turns but R_4 - R_2 = 0, so it keeps d_2 = 1.
    _check(
        [[0.0, 3.0, 1.0, 2.0, 1.0]],
        [[1.0, -2.0, 1.0, -1.0]],
        [[T, F, T, F]],
        consistency_filter=False,
    )


def test_flat_rewards_give_zeros_and_no_turning_point():
    _check([[1.0, 1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0]], [[F, F, F]])


def test_no_overall_change_means_no_turning_point():
    # R_3 == R_0: every s_k = 0; step 0: sign(1) * sign(0 - 1) < 0.
    _check([[0.0, 1.0, -1.0, 0.0]], [[1.0, -2.0, 1.0]], [[F, F, F]])
    # Without the filter step 0 would need s_0 > 0, but s_0 = 0.
    _check([[0.0, 1.0, -1.0, 0.0]], [[1.0, -2.0, 1.0]], [[F, F, F]], consistency_filter=False)


def test_zero_increment_neither_starts_nor_completes_a_flip():
    # d = [-1, 0, 2, 1], g = +, s = [-, 0, +, +]: step 1 has s = 0 (not > 0); step 2 follows
    # s_1 = 0 (not < 0); step 0: sign(-1) * sign(2 + 1) < 0. Nothing turns.
    _check([[0.0, -1.0, -1.0, 1.0, 2.0]], [[-1.0, 0.0, 2.0, 1.0]], [[F, F, F, F]])


def test_zero_first_step_is_not_a_turning_point():
    _check([[0.0, 0.0, 1.0]], [[0.0, 1.0]], [[F, F]])


def test_first_step_rule_and_its_switches():
    # d = [1, -0.5, 1.5], g = +: step 0 consistent (sign(1) * sign(2 - 1) > 0) -> R_3 - R_0 = 2.
    consistent = [[0.0, 1.0, 0.5, 2.0]]
    _check(consistent, [[2.0, -0.5, 1.5]], [[T, F, F]])
    _check(consistent, [[1.0, -0.5, 1.5]], [[F, F, F]], first_step=False)
    # d = [3, -0.5, -0.5], g = +: s_0 > 0 but the rest falls (sign(3) * sign(2 - 3) < 0).
    inconsistent = [[0.0, 3.0, 2.5, 2.0]]
    _check(inconsistent, [[3.0, -0.5, -0.5]], [[F, F, F]])
    _check(inconsistent, [[2.0, -0.5, -0.5]], [[T, F, F]], consistency_filter=False)


def test_single_step_trajectory():
    # K = 1: R_1 - R_1 = 0 fails the first-step filter; without it s_0 > 0 and R_1 - R_0 = d_0.
    _check([[0.0, 1.0]], [[1.0]], [[F]])
    _check([[0.0, 1.0]], [[1.0]], [[T]], consistency_filter=False)


def test_balancing_keeps_the_largest_overall_change_of_the_larger_side():
    rows = [
        [0.0, 1.0, 2.0, 3.0],  # turning at 0, key +3
        [0.0, 0.5, 1.0, 1.5],  # turning at 0, key +1.5 -> dropped, keeps d
        [3.0, 2.0, 1.0, 0.0],  # turning at 0, key -3
    ]
    _check(
        rows,
        [[3.0, 1.0, 1.0], [0.5, 0.5, 0.5], [-3.0, -1.0, -1.0]],
        [[T, F, F], [F, F, F], [T, F, F]],
    )
    _check(
        rows,
        [[3.0, 1.0, 1.0], [1.5, 0.5, 0.5], [-3.0, -1.0, -1.0]],
        [[T, F, F], [T, F, F], [T, F, F]],
        balance=False,
    )


def test_balancing_ranks_by_overall_change_not_by_long_term_reward():
    rows = [
        [0.0, -1.0, 1.0, 2.0],  # turning at 1: reward R_3 - R_1 = 3, key R_3 - R_0 = 2
        [0.0, 1.0, 2.0, 2.5],  # turning at 0: reward 2.5, key 2.5 -> kept
        [0.0, -1.0, -2.0, -3.0],  # turning at 0, key -3
    ]
    _check(
        rows,
        [[-1.0, 2.0, 1.0], [2.5, 1.0, 0.5], [-3.0, -1.0, -1.0]],
        [[F, F, F], [T, F, F], [T, F, F]],
    )


def test_balancing_pools_steps_and_breaks_ties_by_earlier_position():
    rows = [
        # d = [1, 1, -1, 1, 1], s = [+, +, -, +, +]: turning at 0 (R_5 - R_0 = 3) and at 3
        # (consistent, R_5 - R_3 = 2); both keyed +3.
        [0.0, 1.0, 2.0, 1.0, 2.0, 3.0],
        [0.0, -1.0, -2.0, -3.0, -4.0, -5.0],  # turning at 0, key -5
    ]
    _check(
        rows,
        [[3.0, 1.0, -1.0, 1.0, 1.0], [-5.0, -1.0, -1.0, -1.0, -1.0]],
        [[T, F, F, F, F], [T, F, F, F, F]],
    )
    _check(
        rows,
        [[3.0, 1.0, -1.0, 2.0, 1.0], [-5.0, -1.0, -1.0, -1.0, -1.0]],
        [[T, F, F, T, F], [T, F, F, F, F]],
        balance=False,
    )
    # Equal keys across rows: the lower batch index wins.
    tied = [[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0], [0.0, -1.0, -2.0, -3.0]]
    _, mask = _run(tied)
    assert mask.tolist() == [[T, F, F], [F, F, F], [T, F, F]]


def test_one_sided_turning_points_are_all_kept():
    rows = [[0.0, 1.0, 2.0, 3.0], [0.0, -1.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0]]
    _check(
        rows,
        [[3.0, 1.0, 1.0], [-1.0, 3.0, 1.0], [0.0, 0.0, 0.0]],
        [[T, F, F], [F, T, F], [F, F, F]],
    )


def _reference(rows: list[list[float]]) -> tuple[list[list[float]], list[list[bool]]]:
    """The default rules restated with plain Python loops (ties kept in row-major order)."""

    def sign(x: float) -> int:
        return (x > 0) - (x < 0)

    marks, keys = [], []
    for r in rows:
        k_steps = len(r) - 1
        d = [r[k + 1] - r[k] for k in range(k_steps)]
        s = [sign(x) * sign(r[-1] - r[0]) for x in d]
        row = []
        for k in range(k_steps):
            ok = sign(d[k]) * sign(r[-1] - r[k + 1]) > 0
            row.append(ok if k == 0 else (s[k - 1] < 0 and s[k] > 0 and ok))
        marks.append(row)
        keys.append(r[-1] - r[0])
    points = [(b, k) for b, row in enumerate(marks) for k, m in enumerate(row) if m]
    pos = [p for p in points if keys[p[0]] > 0]
    neg = [p for p in points if keys[p[0]] < 0]
    if pos and neg:
        keep = min(len(pos), len(neg))
        chosen = sorted(pos, key=lambda p: -abs(keys[p[0]]))[:keep]
        chosen += sorted(neg, key=lambda p: -abs(keys[p[0]]))[:keep]
        marks = [[(b, k) in chosen for k in range(len(row))] for b, row in enumerate(marks)]
    rewards = [
        [r[-1] - r[k] if marks[b][k] else r[k + 1] - r[k] for k in range(len(r) - 1)]
        for b, r in enumerate(rows)
    ]
    return rewards, marks


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_matches_loop_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    # Small integer rewards make zeros, ties and both signs frequent.
    rows = torch.randint(-3, 4, (12, 6), generator=gen).to(torch.float64)
    want_reward, want_mask = _reference(rows.tolist())
    reward, mask = turning_points(rows)
    assert mask.tolist() == want_mask
    torch.testing.assert_close(reward, torch.tensor(want_reward, dtype=torch.float32))
    assert mask.any()


def test_empty_batch():
    reward, mask = turning_points(torch.zeros(0, 4))
    assert reward.shape == (0, 3) and mask.shape == (0, 3)


def test_input_is_not_modified():
    rows = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    before = rows.clone()
    turning_points(rows)
    assert torch.equal(rows, before)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), (3, 1), (3, 0)])
def test_bad_shapes_raise(shape):
    with pytest.raises(ValueError, match="step_rewards"):
        turning_points(torch.zeros(shape))


def test_non_tensor_raises():
    with pytest.raises(TypeError, match="torch.Tensor"):
        turning_points([[0.0, 1.0]])
