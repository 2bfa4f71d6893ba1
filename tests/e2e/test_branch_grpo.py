"""BranchGRPO on the digits job (configs/digits.yaml): the tree rollout and tree credit train
for two epochs from the CLI, the ratio is 1 before the first update, and an epoch costs fewer
model rows than the chain's, by exactly the rows of the shared prefixes."""

from __future__ import annotations

import pytest

from flowgrpo.cli.main import main
from flowgrpo.run.tracking import read_metrics

QUIET = ["run.epochs=2", "run.eval_every=2", "run.progress=false", "run.tensorboard=false",
         "data.eval_images_per_prompt=1"]
TREE = ["sampler.rollout=tree", "sampler.rollout_params={branch_at: [0, 3, 6], factor: 2}",
        "train.credit=tree"]  # the branch_grpo preset of configs/presets/methods.yaml


def train_rows(run_dir, *overrides: str) -> list[dict]:
    args = ["train", "configs/digits.yaml", "--set", f"run.output_dir={run_dir}"]
    for item in (*QUIET, *overrides):
        args += ["--set", item]
    assert main(args) == 0
    return [row for row in read_metrics(run_dir) if "calls/nograd" in row]


@pytest.mark.slow
def test_branch_grpo_trains_the_digits_job_with_fewer_model_rows_than_chains(tmp_path):
    tree = train_rows(tmp_path / "tree", *TREE)
    chain = train_rows(tmp_path / "chain")
    assert len(tree) == len(chain) == 2
    # one minibatch of 64 per epoch: the first epoch's ratio is the one before any update
    assert abs(tree[0]["train/ratio_mean"] - 1) < 1e-6
    assert tree[0]["credit/tree_nodes"] == 8 * (2 * 3 + 4 * 3 + 8 * 3)  # trained steps 0..8
    # 8 trees of 8 leaves, 10 steps: 1 node rows for step 0, then 2, 4 and 8 after the branches
    # at 0, 3 and 6; chains take 64 rows per step
    saved = 64 * 10 - 8 * (1 + 2 * 3 + 4 * 3 + 8 * 3)
    for t, c in zip(tree, chain):
        assert t["calls/grad"] == c["calls/grad"] > 0
        assert t["calls/nograd"] == c["calls/nograd"] - saved
        assert t["calls/nograd"] + t["calls/grad"] < c["calls/nograd"] + c["calls/grad"]
