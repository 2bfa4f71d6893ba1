"""Trainers and configs of the toy job (the shipped digits model, configs/digits.yaml) for the
tests of the trainer, its methods, resume, faults and kills."""

from __future__ import annotations

import torch

from flowgrpo.config.io import load_config
from flowgrpo.training.trainer import Trainer

TOY = ["train.batch_size=16", "train.group_size=4", "run.tensorboard=false",
       "run.progress=false", "data.eval_images_per_prompt=1"]
"""The toy job (configs/digits.yaml) at 16 samples in groups of 4, quiet."""


def toy_trainer(tmp_path, *overrides: str) -> Trainer:
    """A trainer of the toy job with :data:`TOY` into ``tmp_path``, then ``overrides``."""
    return Trainer.from_config(load_config(None, [f"run.output_dir={tmp_path}", *TOY, *overrides]))


def lora(t: Trainer) -> dict[str, torch.Tensor]:
    """Copies of the transformer's LoRA weights by name."""
    return {n: p.detach().clone() for n, p in t.adapter.transformer.named_parameters()
            if "lora_" in n}


def assert_ratio_one(t: Trainer) -> dict:
    """Run the objective on every unit of one rollout batch before any update; every ratio is 1."""
    batch = t.sample(0)
    t.views.extend(t.session, t.rewards.score, batch, 0)
    adv, metrics = t.advantages(batch)
    from flowgrpo.training.trainer import canonical_advantages

    batch.advantages = canonical_advantages(adv, batch)
    state = t.objective.prepare(batch)
    idx = torch.arange(len(batch.groups))
    units = t.objective.units(batch)
    assert units
    for unit in units:
        _, out = t.objective.loss(batch, state, idx, unit)
        if "train/ratio_max" in out:
            assert abs(float(out["train/ratio_max"]) - 1) <= 1e-6, unit
            assert abs(float(out["train/ratio_min"]) - 1) <= 1e-6, unit
        elif "train/margin" in out:  # a preference objective's: the policy is the reference
            assert float(out["train/margin"]) <= 1e-6, unit
        else:  # a ratio-free objective's analogue: the policy equals the old policy
            assert float(out["train/old_gap"]) <= 1e-6, unit
    return metrics


CHECKPOINTED = ["train.batch_size=8", "train.group_size=4", "run.tensorboard=false",
                "run.progress=false", "data.eval_images_per_prompt=1", "sampler.num_steps=4",
                "run.eval_every=2", "run.save_every=1", "run.keep_checkpoints=3"]
"""The toy job at 8 samples and 4 steps, an eval every 2 epochs and a checkpoint every epoch
(3 kept): the runs that resume, fail and are killed."""


def config(run_dir, *overrides: str):
    """The toy job with :data:`CHECKPOINTED` into ``run_dir``, then ``overrides``."""
    return load_config(None, [f"run.output_dir={run_dir}", *CHECKPOINTED, *overrides])


def weights(t: Trainer) -> list[torch.Tensor]:
    """Copies of the trainable weights."""
    return [p.detach().clone() for p in t.params]


def stable(rows: list[dict]) -> list[dict]:
    """Metrics rows without the wall-clock timings."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
