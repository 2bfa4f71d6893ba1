"""TempFlow-GRPO on the toy: one branching (stochastic) step per sample, Euler elsewhere, the
noise-aware weights in the batch, ratio 1 before the first update, and a run from the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import samplers
from flowgrpo.cli.ablate import load_presets
from flowgrpo.rl import step_selection as steps
from helpers.toy import assert_ratio_one, toy_trainer

ROOT = Path(__file__).resolve().parents[2]


def test_each_sample_branches_once_and_is_euler_elsewhere(tmp_path):
    t = toy_trainer(tmp_path, "train.step_selection=tempflow")
    batch = t.sample(2)
    traj = batch.traj
    assert traj.trained.shape == (16, 1)  # exactly one stochastic, trained step per sample
    candidates = steps.trainable_steps(t.sampler, traj.sigmas)
    for g in batch.groups.unique().tolist():  # cycle: group g branches at candidate (2 + g) % n
        assert (traj.trained[batch.groups == g, 0] == candidates[(2 + g) % len(candidates)]).all()
    ode = samplers.get("ode")
    for k in range(len(traj.sigmas) - 1):
        x = traj.latents[:, k].float()
        v = t.adapter.velocity(x, traj.sigmas[k].expand(16), traj.cond, 1.0)
        euler = ode.transition(v, x, float(traj.sigmas[k]), float(traj.sigmas[k + 1])).mean
        gaps = (traj.latents[:, k + 1] - euler).abs().flatten(1).max(1).values
        branched = traj.trained[:, 0] == k
        assert (gaps[branched] > 1e-3).all() and (gaps[~branched] < 1e-5).all(), (k, gaps)
    assert traj.trained[:, 0].unique().numel() == 4  # the 4 groups branch at 4 steps
    assert torch.isfinite(traj.log_probs).all() and (traj.log_probs != 0).all()
    # the batch carries each sample's noise-aware weight: its step's std over the mean std
    stds = steps.noise_levels(t.sampler, traj.sigmas, candidates)
    mean = sum(stds.values()) / len(stds)
    want = torch.tensor([[stds[int(k)] / mean] for k in traj.trained[:, 0]])
    torch.testing.assert_close(batch.step_weights.cpu(), want, rtol=1e-5, atol=0)
    assert len(set(batch.step_weights[:, 0].tolist())) > 1  # the groups weigh differently


def test_ratio_is_one_before_the_first_update(tmp_path):
    assert_ratio_one(toy_trainer(tmp_path, "train.step_selection=tempflow"))


@pytest.mark.slow
def test_the_preset_trains_two_epochs_from_the_cli(tmp_path):
    from flowgrpo.cli.main import main
    from flowgrpo.run.tracking import read_metrics

    preset = load_presets()["tempflow_grpo"]
    sets = [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
            for key, value in preset.items()]
    sets = [s.removesuffix("\n...") for s in sets]
    overrides = [*sets, f"run.output_dir={tmp_path}", "run.epochs=2", "train.batch_size=16",
                 "train.group_size=4", "sampler.num_steps=6", "run.eval_every=2",
                 "run.progress=false", "run.tensorboard=false", "data.eval_images_per_prompt=1"]
    args = ["train", str(ROOT / "configs" / "digits.yaml")]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    rows = [r for r in read_metrics(tmp_path) if "train/loss" in r]
    assert len(rows) == 2
    assert all(r["calls/grad"] > 0 for r in rows)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["train"]["step_selection"] == "tempflow"
