"""The default job (configs/digits.yaml) on the shipped toy model and digit reward."""

import pytest
import torch

from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config
from flowgrpo.rl.replay import replay_step
from flowgrpo.run.tracking import read_metrics


def test_toy_ratio_is_one_before_the_first_update(tmp_path):
    from flowgrpo.training.trainer import Trainer

    cfg = load_config(None, [f"run.output_dir={tmp_path}", "train.batch_size=16",
                             "run.tensorboard=false"])
    t = Trainer.from_config(cfg)
    batch = t.sample(0)
    idx = torch.arange(16)
    assert batch.traj.num_trained == cfg.sampler.num_steps - 1
    for j in range(batch.traj.num_trained):
        logp = replay_step(t.adapter, t.sampler, batch.traj, idx, j, cfg.model.guidance).log_prob
        ratio = torch.exp(logp - batch.traj.log_probs[:, j])
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_default_job_raises_the_eval_reward(tmp_path):
    """A short run of the default job: the eval reward on fixed seeds must go up."""
    out = tmp_path / "run"
    assert main(["train", "--set", "run.epochs=60", "--set", "run.eval_every=60",
                 "--set", f"run.output_dir={out}", "--set", "run.progress=false"]) == 0
    rows = read_metrics(out)
    evals = [r["eval/reward"] for r in rows if "eval/reward" in r]
    assert len(evals) == 2 and 0.3 < evals[0] < 0.7  # the shipped base model leaves headroom
    assert evals[-1] > evals[0] + 0.03, evals
    assert all("reward/mean" in r and "train/kl" in r for r in rows if r["step"] > 0)
    assert (out / "checkpoints" / "step_60" / "lora" / "pytorch_lora_weights.safetensors").is_file()
