"""Run-directory pieces: media saving per modality, atomic checkpoints, EMA, serve-reward CLI."""

import subprocess
import sys

import pytest
import torch

from flowgrpo.rl.ema import EMA
from flowgrpo.run import checkpoint as ckpt
from flowgrpo.run.tracking import Tracker, read_metrics


def test_tracker_saves_every_modality(tmp_path):
    t = Tracker(tmp_path, enabled=True, tensorboard=False, wandb_project=None, config={})
    t.log(1, {"reward/mean": torch.tensor(0.5), "eval/reward": 0.25})
    assert read_metrics(tmp_path) == [{"step": 1, "reward/mean": 0.5, "eval/reward": 0.25}]
    assert t.save_media(1, "eval", torch.rand(4, 3, 16, 16), "image").is_file()
    t.save_media(1, "eval", torch.rand(2, 5, 3, 8, 8), "video", nrow=2)
    assert (tmp_path / "samples" / "eval_00001_0.gif").is_file()
    assert (tmp_path / "samples" / "eval_00001_1_grid.png").is_file()
    t.save_media(1, "eval", torch.rand(2, 2, 800) * 2 - 1, "audio", sample_rate=8000, nrow=2)
    assert (tmp_path / "samples" / "eval_00001_1.wav").is_file()
    t.close()


def test_checkpoint_commit_is_atomic_and_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        tmp = ckpt.begin(tmp_path, step)
        ckpt.write_json(tmp / "state.json", {"step": step})
        assert ckpt.latest_checkpoint(tmp_path) == (None if step == 1 else
                                                     tmp_path / "checkpoints" / f"step_{step - 1}")
        ckpt.commit(tmp, keep=2)
    assert [p.name for p in ckpt.checkpoint_dirs(tmp_path)] == ["step_2", "step_3"]
    # a crash mid-write leaves only a hidden temporary folder, never a half step_N
    ckpt.begin(tmp_path, 4)
    assert ckpt.latest_checkpoint(tmp_path).name == "step_3"


def test_optimizer_state_round_trips_without_pickle():
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    tensors, meta = ckpt.optimizer_to_flat(opt.state_dict())
    fresh = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone())], lr=0.1)
    fresh.load_state_dict(ckpt.optimizer_from_flat(tensors, meta))
    a, b = opt.state_dict()["state"][0], fresh.state_dict()["state"][0]
    assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_ema_tracks_and_swaps_weights():
    p = torch.nn.Parameter(torch.zeros(2))
    ema = EMA([p], decay=0.5)
    with torch.no_grad():
        p.fill_(1.0)
    ema.update()
    with ema.applied():
        assert torch.equal(p.detach(), torch.full((2,), 0.5))
    assert torch.equal(p.detach(), torch.ones(2))


@pytest.mark.slow
def test_serve_reward_is_a_flowgrpo_command():
    out = subprocess.run([sys.executable, "-m", "flowgrpo.cli", "serve-reward", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--reward" in out.stdout and "loopback" in out.stdout
