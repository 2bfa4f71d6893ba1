"""The flowgrpo command end to end on a tiny SD3: train, report, sample, eval, config, list."""

import pytest
import yaml

from flowgrpo.cli.main import main
from helpers.tiny_runs import write_tiny_config


@pytest.fixture
def tiny_config(tiny_sd3_dir, tmp_path, brightness_reward):
    return write_tiny_config(tmp_path, tiny_sd3_dir, brightness_reward, eval_every=1,
                             save_every=1)


@pytest.mark.slow
def test_train_report_sample_eval(tiny_config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(tiny_config)]) == 0
    for name in ("config.yaml", "metrics.jsonl", "samples/eval_00002.png"):
        assert (run / name).is_file(), name
    assert list((run / "tb").iterdir())
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "eval reward" in out and (run / "report.png").stat().st_size > 1000
    png = tmp_path / "grid.png"
    assert main(["sample", "--run", str(run), "--prompt", "a handwritten digit 1", "--num", "2",
                 "--sampler", "sde", "--out", str(png)]) == 0
    assert png.stat().st_size > 0
    assert main(["eval", "--run", str(run)]) == 0
    assert "eval/reward:" in capsys.readouterr().out


def test_config_prints_resolved_yaml_and_lists_registries(tiny_config, capsys):
    assert main(["config", str(tiny_config), "--set", "train.lr=0.01"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["lr"] == 0.01 and printed["sampler"]["num_steps"] == 4
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "samplers: cps, ctmc, langevin, ode, sde, vq_diffusion" in out and "losses: clip" in out
    for line in ("objectives: awm, dflow_grpo, dgpo, dpo, elbo, nft, ratio, sft, udm_grpo",
                 "pruners: dppo, none",
                 "kl estimators: exact, flow_grpo, log_ratio, ratio_k3, velocity_mse, x_mse",
                 "losses: clip, gate, guard, mhpo, mu_grpo, sapo, stable, unclipped",
                 "advantages: a_grae, dual_anchor, focal, global_std, group, none, rcc",
                 "step selections: all, flash, tempflow, window",
                 "credits: outcome, tree, turning_point", "enhancers: callable, remote, template",
                 "window strategies: progressive, random, fixed, decay, exp_decay"):
        assert line in out
    assert main(["config", "--help-fields"]) == 0
    fields = capsys.readouterr().out
    for key in ("objective", "step_selection_params", "credit", "views", "enhancer_params", "kl",
                "advantage_params", "pruner", "pruner_params"):
        assert f"  {key} = " in fields


def test_bad_override_exits_2_with_message(tiny_config, capsys):
    assert main(["config", str(tiny_config), "--set", "train.group_size=3"]) == 2
    assert "train.batch_size" in capsys.readouterr().err
