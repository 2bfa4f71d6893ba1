"""Tiny discrete (token) models built in code: the toy's architecture at its smallest, one per
token path, with random weights."""

from __future__ import annotations

import torch

from pipelines.digits_discrete import LEVELS, DigitTokenModel, DigitTokenPipeline


def tiny_digits_discrete_pipeline(seed: int = 0, path: str = "masked", dim: int = 16,
                                  depth: int = 1) -> DigitTokenPipeline:
    """A random :class:`DigitTokenModel` of width ``dim`` for the token ``path``."""
    torch.manual_seed(seed)
    states = LEVELS + 1 if path == "masked" else LEVELS
    return DigitTokenPipeline(DigitTokenModel(states, dim=dim, depth=depth, heads=2), path)


def tiny_discrete_trainer(tmp_path, objective: str, path: str = "masked", steps: int = 4, *,
                          family: str = "digits_discrete", folder=None, reward: str = "digit",
                          **train):
    """A :class:`~flowgrpo.training.trainer.Trainer` of the tiny ``path`` model (saved once
    under ``tmp_path``) with the ``ctmc`` sampler, ``objective`` and ``train`` settings: 4
    samples in groups of 2, one epoch.

    Another token family (a registered name or a ``file.py:Class`` reference) trains the same
    way from its own model ``folder`` (``path`` is then unused), scored by ``reward``."""
    from flowgrpo.config.io import from_dict
    from flowgrpo.training.trainer import Trainer

    if folder is None:
        folder = tmp_path / f"model-{path}"
        if not folder.exists():
            tiny_digits_discrete_pipeline(path=path).save_pretrained(str(folder))
    cfg = from_dict({
        "model": {"family": family, "path": str(folder), "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": reward},
        "data": {"prompts": "digits", "eval_images_per_prompt": 1},
        "sampler": {"name": "ctmc", "params": {}, "num_steps": steps},
        "train": {"group_size": 2, "batch_size": 4, "lr": 1e-2, "objective": objective,
                  **train},
        "run": {"epochs": 1, "output_dir": str(tmp_path / "run"), "progress": False,
                "tensorboard": False},
    })
    return Trainer.from_config(cfg, overwrite=True)
