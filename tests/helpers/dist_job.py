"""Run by test_distributed under ``accelerate launch --multi_gpu --num_processes 2`` on CPU.

Ends its process group through :func:`helpers.jobs.run` (a live gloo group at interpreter exit
can abort a rank; the reason is written there)."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package

from flowgrpo.config.io import from_dict  # noqa: E402
from flowgrpo.training.trainer import Trainer  # noqa: E402
from helpers.jobs import run  # noqa: E402
from helpers.tiny_runs import register_brightness  # noqa: E402


def main(model_dir: str, out: str) -> None:
    register_brightness()
    cfg = from_dict({
        "model": {"path": model_dir, "lora_rank": 4, "lora_alpha": 4},
        "reward": {"name": "brightness_test"},
        "data": {"eval_images_per_prompt": 1},
        "train": {"group_size": 4, "batch_size": 4, "lr": 1e-3},
        "sampler": {"num_steps": 4},
        "run": {"epochs": 2, "eval_every": 1, "save_every": 2, "output_dir": out,
                "progress": False, "tensorboard": False},
    })
    t = Trainer.from_config(cfg)
    row = t.train()
    weights = torch.cat([p.detach().flatten() for p in t.params])
    with open(f"{out}/rank{t.rank}.json", "w") as f:
        json.dump({"world": t.world, "rank": t.rank, "checksum": weights.double().sum().item(),
                   "reward_mean": row["reward/mean"], "samples": row["train/samples"]}, f)


if __name__ == "__main__":
    run(main, sys.argv[1], sys.argv[2])
