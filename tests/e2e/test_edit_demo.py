"""The CPU editing demo (configs/digit_edit.yaml): the shipped toy editing model rewrites the
right-hand digit of a two-digit image; region advantages reach only the output tokens of their
cell; a short run raises the eval reward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowgrpo.cli.main import main
from flowgrpo.config.io import load_config
from flowgrpo.data.prompts import load_prompts
from flowgrpo.run.tracking import read_metrics
from helpers import ROOT

CONFIG = ROOT / "configs" / "digit_edit.yaml"


def test_the_shipped_edit_model_and_its_sources_load():
    from flowgrpo.training.model_setup import load_adapter

    cfg = load_config(CONFIG)
    items = load_prompts(cfg.data.prompts)
    assert len(items) == 40
    for prompt, meta in items:
        assert Path(meta["image"]).is_file() and meta["boxes"] == [[0.5, 0.0, 1.0, 1.0]]
        assert prompt == f"a handwritten digit {meta['digit']}"
    adapter = load_adapter(cfg.model)
    cond = adapter.encode_inputs([items[0][0]], [items[0][1]])
    x = adapter.noise(1, torch.Generator().manual_seed(0))
    assert x.shape == (1, 32, 16)  # 16x32 pixels -> 8x16 latents -> 4x8 tokens of 2x2x4
    assert cond.tensors["image_latents"].shape == (1, 32, 16)  # the source rides in the condition
    with torch.no_grad():
        assert adapter.velocity(x, torch.ones(1), cond, 1.0).shape == x.shape


def test_each_region_cell_reaches_only_its_own_output_tokens(tmp_path):
    """The reward's 2 x 4 grid of 8x8-pixel cells maps onto the 4 x 8 grid of generated tokens
    (4x4 pixels each): every cell's map is 1 on its 2 x 2 tokens and 0 elsewhere; the source's
    tokens are never latents."""
    from flowgrpo.training.trainer import Trainer

    cfg = load_config(CONFIG, [f"run.output_dir={tmp_path}", "train.batch_size=8",
                               "train.group_size=4", "run.progress=false",
                               "run.tensorboard=false", "sampler.num_steps=3"])
    t = Trainer.from_config(cfg)
    batch = t.sample(0)
    assert batch.reward.regions.shape == (8, 2, 4)
    adv, _ = t.advantages(batch)
    assert adv.shape == (8, 1, 1, 8)  # one advantage per cell
    maps = batch.regions[..., 0]  # [cells, tokens]
    assert maps.shape == (8, 32)
    for cell in range(8):
        row, col = divmod(cell, 4)
        tokens = torch.zeros(4, 8)
        tokens[2 * row:2 * row + 2, 2 * col:2 * col + 2] = 1
        torch.testing.assert_close(maps[cell], tokens.flatten())


@pytest.mark.slow
def test_the_edit_demo_raises_its_eval_reward(tmp_path):
    out = tmp_path / "run"
    # measured (eval every 10 epochs): 0.666, 0.675, 0.685, 0.698, 0.711 at epoch 40, 0.710
    assert main(["train", str(CONFIG), "--set", "run.epochs=40", "--set", "run.eval_every=40",
                 "--set", f"run.output_dir={out}", "--set", "run.progress=false",
                 "--set", "run.tensorboard=false"]) == 0
    evals = [r["eval/reward"] for r in read_metrics(out) if "eval/reward" in r]
    assert len(evals) == 2 and evals[-1] > evals[0] + 0.02, evals
